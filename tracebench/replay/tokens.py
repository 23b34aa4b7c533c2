"""Input ids: exactly `input_len` tokens per request, the same for the same (trace, request id), always inside the
model's vocabulary.

Real sglang dies on an id >= vocab_size (../shared/sglang-device/README.md), so the vocabulary size is a required
fact, never a guess: from the model's config.json, from the simulated server's arguments, or from `--vocab-size`.
Ids below TOKEN_ID_LOW are avoided: llama-style vocabularies keep special and byte tokens there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from tracebench.errors import ConfigError

TOKEN_ID_LOW = 1000  # ids below this are special/byte tokens in llama-style vocabularies: never sent


class InputIds:
    """Deterministic input ids for one trace: `ids(request_id, n)` depends only on (trace sha256, request id, n)."""

    __slots__ = ("_entropy", "vocab_size")

    def __init__(self, trace_sha256: str, vocab_size: int) -> None:
        if vocab_size <= 2 * TOKEN_ID_LOW:
            raise ConfigError(f"vocab size {vocab_size} is too small: input ids are drawn from [{TOKEN_ID_LOW}, vocab size)")
        self._entropy = int(trace_sha256, 16)
        self.vocab_size = vocab_size

    def ids(self, request_id: int, n: int) -> np.ndarray:
        # One small generator per request (~20 us for 512 ids): any request's ids can be made alone, in any order.
        gen = np.random.Generator(np.random.PCG64([self._entropy, request_id]))
        return gen.integers(TOKEN_ID_LOW, self.vocab_size, size=n, dtype=np.int64)


def vocab_size_from_model(model_path: str | Path) -> int:
    """`vocab_size` from MODEL/config.json (MODEL may also be the config file itself)."""
    path = Path(model_path)
    config = path / "config.json" if path.is_dir() else path
    if not config.is_file():
        raise ConfigError(f"--model {model_path}: no config.json there (needed for the model's vocab_size)")
    try:
        obj = orjson.loads(config.read_bytes())
    except orjson.JSONDecodeError as err:
        raise ConfigError(f"{config}: not JSON ({err})") from None
    vocab = obj.get("vocab_size") if isinstance(obj, dict) else None
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise ConfigError(f"{config}: field 'vocab_size': missing or not a positive integer ({vocab!r})")
    return vocab
