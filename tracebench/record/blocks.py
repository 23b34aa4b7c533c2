"""Prefix blocks without content: a prompt's tokens become chained, salted block ids (docs/record.md).

Block k of a prompt covers tokens [k*B, (k+1)*B) (the last block may be partial). Its id is the first 63 bits of
BLAKE2b-64 keyed with the recording's salt over (the previous block's digest, the block's tokens as int64). So a
block id depends on every token up to the end of its block: equal ids mean equal prefixes, and the random salt
(never written anywhere) makes the ids meaningless outside the one recorded file. Nothing else of the prompt is kept.

Prompt text is turned into token ids by a `tokenizer.json`: a WordLevel model with a whitespace pre-tokenizer (the
word-level tokenizer of the GPU setup and the simulator, also given by its name `wordlevel`: tracebench/wordlevel.py)
is read here without any library; any other model needs the optional `tokenizers` package
(`pip install 'tracebench[record]'`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from hashlib import blake2b
from pathlib import Path

import numpy as np
import orjson

from tracebench.errors import ConfigError

_ID_MASK = (1 << 63) - 1  # trace ids are 64-bit signed integers: keep them >= 0
PAD_TOKEN = -1  # stands for prompt tokens the server counted but the proxy could not see (chat template, BOS)

Tokenize = Callable[[str], list[int]]


def prefix_blocks(tokens: Sequence[int] | np.ndarray, input_len: int, block_size: int, salt: bytes) -> tuple[int, ...]:
    """The chained block ids of a prompt whose server-counted length is `input_len`: ceil(input_len / block_size)
    ids. `tokens` is what the proxy saw; when the server counted a different length (a chat template's tokens, a
    BOS), the sequence is cut to input_len or padded with PAD_TOKEN, so the trace stays consistent
    (len(blocks) == ceil(input_len / block_size)) and equal prompts still get equal ids."""
    ids = np.asarray(tokens, dtype=np.int64)
    if len(ids) != input_len:
        ids = np.concatenate([ids[:input_len], np.full(max(0, input_len - len(ids)), PAD_TOKEN, dtype=np.int64)])
    raw = ids.astype("<i8", copy=False).tobytes()
    step = block_size * 8
    blocks = []
    digest = b""
    for start in range(0, len(raw), step):
        digest = blake2b(digest + raw[start:start + step], digest_size=8, key=salt).digest()
        blocks.append(int.from_bytes(digest, "little") & _ID_MASK)
    return tuple(blocks)


_WHITESPACE = re.compile(r"\w+|[^\w\s]+")  # the `Whitespace` pre-tokenizer of tokenizers


WORDLEVEL_NAME = "wordlevel"  # --tokenizer wordlevel: the word-level tokenizer, no file needed


def load_tokenizer(path: Path) -> tuple[Tokenize, str]:
    """A text -> token ids function from PATH (a tokenizer.json, a folder holding one, or the name `wordlevel`),
    and a one-line description of how it tokenizes. Raises ConfigError naming the file and what is wrong."""
    if str(path) == WORDLEVEL_NAME and not path.exists():
        from tracebench.wordlevel import tokenizer_spec

        spec = tokenizer_spec()
        return _word_level(path, spec, spec["model"])  # type: ignore[return-value]  # a WordLevel spec: never None
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"--tokenizer {path}: no tokenizer.json there")
    try:
        spec = orjson.loads(file.read_bytes())
    except orjson.JSONDecodeError as err:
        raise ConfigError(f"{file}: not JSON ({err})") from None
    model = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(model, dict):
        raise ConfigError(f"{file}: field 'model': missing (is this a tokenizers tokenizer.json?)")
    own = _word_level(file, spec, model)
    if own is not None:
        return own
    try:
        from tokenizers import Tokenizer  # optional: only for tokenizers other than the word-level one
    except ImportError:
        raise ConfigError(
            f"{file}: a {model.get('type')!r} tokenizer (pre-tokenizer {_kind(spec.get('pre_tokenizer'))}) needs the "
            "'tokenizers' package: pip install 'tracebench[record]' (tracebench reads only WordLevel models with a "
            "whitespace pre-tokenizer and no normalizer or post-processor by itself)"
        ) from None
    tokenizer = Tokenizer.from_file(str(file))

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=True).ids

    return encode, f"{file} via the tokenizers package ({model.get('type')})"


def _kind(part: object) -> str:
    return repr(part.get("type")) if isinstance(part, dict) else "none"


def _word_level(file: Path, spec: dict, model: dict) -> tuple[Tokenize, str] | None:
    """The WordLevel model read directly, or None when the file needs the tokenizers package. What such a
    tokenizer does: no normalizer, split on whitespace (WhitespaceSplit) or on \\w+|[^\\w\\s]+ (Whitespace), look
    every piece up in the vocabulary (unknown pieces -> unk_token), no post-processor (no BOS/EOS added)."""
    pre = spec.get("pre_tokenizer")
    pre_type = pre.get("type") if isinstance(pre, dict) else None
    if model.get("type") != "WordLevel" or spec.get("normalizer") is not None or spec.get("post_processor") is not None:
        return None
    if pre_type not in ("WhitespaceSplit", "Whitespace"):
        return None
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise ConfigError(f"{file}: field 'model.vocab': must map words to integer ids")
    unk = model.get("unk_token")
    unk_id = vocab.get(unk) if isinstance(unk, str) else None
    split: Callable[[str], list[str]] = str.split if pre_type == "WhitespaceSplit" else _WHITESPACE.findall
    get = vocab.get

    def encode(text: str) -> list[int]:
        ids = [get(word, unk_id) for word in split(text)]
        if unk_id is None and None in ids:
            ids = [i if i is not None else PAD_TOKEN for i in ids]  # no unk token: an unknown word is still a token
        return ids  # type: ignore[return-value]

    return encode, f"{file} (WordLevel, {pre_type}, {len(vocab)} words; read by tracebench)"
