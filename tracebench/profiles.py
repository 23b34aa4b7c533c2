"""The simulator's timing profiles: one model on one GPU, its step costs and KV capacity (`Profile`), the built-in ones
shipped in tracebench/sim/profiles/, and which of them stands for a GPU by its name. Low in the package, so that
every layer reads them from one place: the simulator's model (sim/model.py) times its steps with a profile, the
capacity rule (capacity.py) weighs a trace against one, `sim-server --gpu` and `replay --sim-gpu` pick one
(sim/catalog.py)."""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tracebench.errors import ConfigError

PROFILES_DIR = Path(__file__).resolve().parent / "sim" / "profiles"
DEFAULT_PROFILE = "llama-2-7b-h200-triton"


@dataclass(frozen=True)
class Profile:
    """Step costs and per-request overheads of one model on one GPU (seconds, at speed 1)."""

    name: str
    prefill_base_s: float          # a: fixed cost of a prefill step
    prefill_per_token_s: float     # b: per new (uncached) input token in the step
    prefill_per_token_sq_s: float  # q: attention, per (token x earlier token of the same request)
    prefill_min_s: float           # a prefill step never takes less (launch-bound floor of short prompts)
    decode_base_s: float           # c: fixed cost of a decode step
    decode_per_req_s: float        # d: per running request in the batch
    decode_per_kv_token_s: float   # e: per KV token the batch attends to
    queue_entry_s: float           # request received by the HTTP server -> in the scheduler's waiting queue
    plan_lag_s: float              # R: a step's start -> the next step planned (the scheduler processes the last
                                   # result first), so a request ready within R of a step's start joins the next one
    dispatch_s: float              # request received -> tokenized and dispatched (a stamp only)
    output_s: float                # a token sampled on the GPU -> handed to the HTTP layer (detokenizer, IPC)
    client_overhead_s: float       # client-measured e2e minus server e2e; real HTTP provides it when served
    max_total_num_tokens: int      # KV capacity of the GPU for this model
    context_length: int
    chunked_prefill_size: int
    accelerator: str
    # sglang's prefill CUDA-graph token buckets (/server_info cuda_graph_config.prefill.bs, ascending): a prefill
    # step of n new tokens runs its GEMMs at the smallest bucket >= n (`padded_tokens`)
    prefill_token_buckets: tuple[int, ...]
    source: str = ""

    def prefill_duration(self, chunks: list[tuple[int, int]]) -> float:
        """One prefill step over `chunks` = [(tokens already prefilled, new tokens), ...], one per request:
        max(min, a + b * padded(new) + q * sum((done + new)^2 - done^2)): the linear part (GEMMs) at the CUDA graph's
        padded token count, attention at the real one."""
        new = 0
        pairs = 0
        for done, take in chunks:
            new += take
            end = done + take
            pairs += end * end - done * done
        return max(self.prefill_min_s, self.prefill_base_s + self.prefill_per_token_s * padded_tokens(
            new, self.prefill_token_buckets) + self.prefill_per_token_sq_s * pairs)

    def decode_duration(self, batch_size: int, kv_tokens: int) -> float:
        return self.decode_base_s + self.decode_per_req_s * batch_size + self.decode_per_kv_token_s * kv_tokens


# sglang 0.5.17 replays a prefill step as a CUDA graph (the default "breakable" backend) only when the padding to the
# bucket at most doubles the tokens (model_executor/runner/prefill_cuda_graph_runner.py L133-136, L1090-1097;
# _pad_to_bucket: runner/base_cuda_graph_runner.py L134-148); above the largest bucket, or beyond 2x, it runs eager
# at the real token count
MAX_PREFILL_PADDING_FACTOR = 2


def padded_tokens(n: int, buckets: Sequence[int]) -> int:
    """The token count a prefill step of `n` new tokens computes its GEMMs at: the smallest bucket >= n when a
    CUDA graph replays it, else n."""
    if not buckets or n > buckets[-1]:
        return n
    padded = buckets[bisect.bisect_left(buckets, n)]
    return padded if padded <= MAX_PREFILL_PADDING_FACTOR * n else n


_PROFILE_FIELDS = {f for f in Profile.__dataclass_fields__}


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (a file in `tracebench/sim/profiles/`) or by path to a JSON file
    `{"name": ..., "source": ..., "params": {every Profile field}}`. Every field is required."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = PROFILES_DIR / f"{name_or_path}.json"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.json"))
        raise ConfigError(f"--profile {name_or_path!r}: no such profile file {path} (built-in: {', '.join(known)})")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not valid JSON: {err}") from err
    for key in ("name", "source", "params"):
        if key not in raw:
            raise ConfigError(f"{path}: profile lacks top-level field '{key}'")
    params = raw["params"]
    wanted = _PROFILE_FIELDS - {"name", "source"}
    missing = sorted(wanted - set(params))
    if missing:
        raise ConfigError(f"{path}: field 'params': lacks {', '.join(missing)}")
    unknown = sorted(set(params) - wanted)
    if unknown:
        raise ConfigError(f"{path}: field 'params': unknown {', '.join(unknown)}")
    buckets = params["prefill_token_buckets"]
    if not (isinstance(buckets, list) and all(type(b) is int and b > 0 for b in buckets) and buckets == sorted(buckets)):
        raise ConfigError(f"{path}: field 'params.prefill_token_buckets': must be ascending positive integers")
    return Profile(name=raw["name"], source=raw["source"], **{**params, "prefill_token_buckets": tuple(buckets)})


def builtin_profiles() -> list[Profile]:
    """Every profile shipped in tracebench/sim/profiles/, by name."""
    return [load_profile(path.stem) for path in sorted(PROFILES_DIR.glob("*.json"))]


def profiles_of_gpu(gpu: str) -> list[Profile]:
    """The built-in profiles whose accelerator names `gpu`: every word of `gpu` (case-insensitive) is a word of the
    accelerator, so "H100", "h100 80gb" and "NVIDIA H100 80GB HBM3" name llama-2-7b-h100-triton's. One is a match;
    none or several, no match (the callers say so, or take none)."""
    words = gpu.lower().split()
    return [p for p in builtin_profiles() if words and set(words) <= set(p.accelerator.lower().split())]
