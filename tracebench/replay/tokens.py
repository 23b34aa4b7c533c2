"""Input ids: exactly `input_len` tokens per request, the same for the same (trace, request id), always inside the
model's vocabulary.

Requests with prefix blocks (trace `prefix_blocks`, header `block_size`) are made of their blocks: block id b is
always the same `block_size` ids (from the trace sha256 and b alone), a request's partial last block its first ids,
so requests whose leading block ids agree send identical leading tokens and sglang's radix cache can reuse them.

Real sglang dies on an id >= vocab_size (tests/data/sglang-0.5.17/oob_capture.json, .DUCUMENT/failure-modes.md), so
the vocabulary size is a required fact, never a guess: from the model's config.json, from the simulated server's
arguments, or from `--vocab-size`.
Ids below TOKEN_ID_LOW are avoided: llama-style vocabularies keep special and byte tokens there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from tracebench.errors import ConfigError

TOKEN_ID_LOW = 1000  # ids below this are special/byte tokens in llama-style vocabularies: never sent

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic): a cheap, well-spread hash."""
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


class InputIds:
    """Deterministic input ids for one trace: `ids(request_id, n)` depends only on (trace sha256, request id, n)."""

    __slots__ = ("_entropy", "_block_key", "_block_offsets", "block_size", "vocab_size")

    def __init__(self, trace_sha256: str, vocab_size: int, block_size: int | None = None) -> None:
        if vocab_size <= 2 * TOKEN_ID_LOW:
            raise ConfigError(f"vocab size {vocab_size} is too small: input ids are drawn from [{TOKEN_ID_LOW}, vocab size)")
        self._entropy = int(trace_sha256, 16)
        self.vocab_size = vocab_size
        self.block_size = block_size
        self._block_key = _U64(int(trace_sha256[:16], 16))
        # position of each id inside its block, spread so that block b's ids never run into block b+1's
        self._block_offsets = None if block_size is None else np.arange(block_size, dtype=np.uint64) * _GOLDEN

    def ids(self, request_id: int, n: int) -> np.ndarray:
        # One small generator per request (~20 us for 512 ids): any request's ids can be made alone, in any order.
        gen = np.random.Generator(np.random.PCG64([self._entropy, request_id]))
        return gen.integers(TOKEN_ID_LOW, self.vocab_size, size=n, dtype=np.int64)

    def block_ids(self, blocks: tuple[int, ...], n: int) -> np.ndarray:
        """The `n` input ids of a request made of `blocks` (block_size ids each; the last block may be cut): id j of
        block b depends only on (trace sha256, b, j). All blocks in one vectorised pass (~30 us for 14 blocks of
        512), so building a prompt adds no release lag."""
        if self._block_offsets is None:
            raise ConfigError("the trace has prefix_blocks but its header gives no block_size")
        # two's-complement view: negative block ids (allowed by the trace format) map to distinct uint64 keys
        keys = _mix64(np.array(blocks, dtype=np.int64).view(np.uint64) ^ self._block_key)
        with np.errstate(over="ignore"):
            hashed = _mix64(keys[:, None] + self._block_offsets[None, :]).ravel()[:n]
        span = _U64(self.vocab_size - TOKEN_ID_LOW)
        return (hashed % span).astype(np.int64) + TOKEN_ID_LOW


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
