"""The simulator's timing profiles: one model on one GPU, its step costs and KV capacity (`Profile`), the built-in ones
shipped in tracebench/sim/profiles/, and which of them stands for a GPU by its name. Low in the package, so that
every layer reads them from one place: the simulator's model (sim/model.py) times its steps with a profile, the
capacity rule (capacity.py) weighs a trace against one, `sim-server --gpu` and `replay --sim-gpu` pick one
(sim/catalog.py)."""

from __future__ import annotations

import bisect
import heapq
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tracebench.errors import ConfigError

PROFILES_DIR = Path(__file__).resolve().parent / "sim" / "profiles"
DEFAULT_PROFILE = "llama-2-7b-h200-triton"
# A streamed token's chunk is small and reaches the client sooner than the answer's last chunk (which carries
# meta_info and follows sglang's end-of-request work): sglang's response_sent_to_client_ts (a stream's first chunk)
# -> the client's read of the first token, p50 on the committed real runs that have it: 0.20-0.31 ms (H100
# routing-long, waits cap4 / uncapped / static8, H200 overhead-plain), against 0.56-0.61 ms for the last chunk.
TOKEN_HOP_S = 0.00025


@dataclass(frozen=True)
class DecodeAttention:
    """The attention part of a decode step, as sglang 0.5.17's triton backend runs it (`decode_attention_tokens`):
    t x makespan x (1 - shared_saving x shared / KV), plus, for a batch of few programs, few_programs_token_s x its
    longest program x (1 - programs / few_programs)."""

    token_s: float                 # t: per token of the makespan (a program walks its KV tokens one after another)
    slots: int                     # programs of one head that run at once on the GPU (H200: 5 per SM x 132 / 32)
    program_overhead_tokens: int   # a program's fixed cost, in tokens walked
    few_programs: int              # a batch of fewer programs (all heads) runs its tokens faster ...
    few_programs_token_s: float    # ... by this (negative) per token of its longest program x (1 - programs / few)
    shared_saving: float           # the share of the makespan saved per share of KV read through a shared prefix
    kv_splits: int                 # sglang's --triton-attention-num-kv-splits
    sm_count: int                  # the GPU's SMs (the split rule's device_core_count)
    heads: int                     # the model's query heads (llama-2-7b: 32, no GQA)
    graph_batch_sizes: tuple[int, ...]   # sglang's decode CUDA-graph batch sizes (a batch runs padded to one)


@dataclass(frozen=True)
class PrefillAttention:
    """The attention part of a prefill (extend) step, as sglang 0.5.17's triton backend runs it
    (kernels/ops/attention/extend_attention.py `extend_attention_fwd`, Hopper, head dim 128: BLOCK_M 128, BLOCK_N 64):
    one program per (request, head, block of block_m new tokens) walks the request's cached prefix and then its new
    tokens up to its block's end (causal), in tiles of block_n; the step's attention is token_s x the makespan of
    those walks: max(all walks / slots, the longest walk) (`prefill_attention_tokens`)."""

    token_s: float                 # per token of the makespan (32 layers)
    slots: int                     # programs (all heads) whose walks share the GPU at once, an effective figure
    program_overhead_tokens: int   # a program's fixed cost, in tokens walked
    block_m: int                   # new tokens per program (sglang: 128 on Hopper for head dim 128)
    block_n: int                   # KV tokens per tile (sglang: 64): a walk rounds up to it
    heads: int                     # the model's query heads (llama-2-7b: 32)


@dataclass(frozen=True)
class Profile:
    """Step costs and per-request overheads of one model on one GPU (seconds, at speed 1)."""

    name: str
    prefill_base_s: float          # a: fixed cost of a prefill step
    prefill_per_token_s: float     # b: per new (uncached) input token in the step
    prefill_per_token_sq_s: float  # q: attention, per (token x earlier token of the same request)
    prefill_min_s: float           # a prefill step never takes less (launch-bound floor of short prompts)
    # the prefill attention as sglang 0.5.17's triton extend kernel runs it (None: the q term above; with it q is 0)
    prefill_attention: PrefillAttention | None
    decode_base_s: float           # c: fixed cost of a decode step
    decode_per_req_s: float        # d: per running request in the batch
    decode_per_kv_token_s: float   # e: per KV token the batch attends to
    # the decode attention as sglang 0.5.17's triton backend runs it (None: the step is c + d B + e KV)
    decode_attention: DecodeAttention | None
    queue_entry_s: float           # request received by the HTTP server -> in the scheduler's waiting queue
    plan_lag_s: float              # R: a step's start -> the next step planned (the scheduler processes the last
                                   # result first), so a request ready within R of a step's start joins the next one
    dispatch_s: float              # request received -> tokenized and dispatched (a stamp only)
    output_s: float                # a token sampled on the GPU -> handed to the HTTP layer (detokenizer, IPC)
    client_overhead_s: float       # client-measured e2e minus server e2e (calibration client); real HTTP provides it
    # the HTTP hops of tracebench's client to this sglang, p50 over the fit's routing runs (the virtual clock's
    # constants; real HTTP provides them when served): dispatch -> sglang's request_received_ts, and
    # request_finished_ts -> the client's read of the answer's end
    request_hop_s: float
    response_hop_s: float
    max_total_num_tokens: int      # KV capacity of the GPU for this model
    context_length: int
    chunked_prefill_size: int
    accelerator: str
    # sglang's prefill CUDA-graph token buckets (/server_info cuda_graph_config.prefill.bs, ascending): a prefill
    # step of n new tokens runs its GEMMs at the smallest bucket >= n (`padded_tokens`)
    prefill_token_buckets: tuple[int, ...]
    source: str = ""

    def prefill_duration(self, chunks: list[tuple[int, int]]) -> float:
        """One prefill step over `chunks` = [(tokens already prefilled, new tokens), ...], one per request
        (prefill_step_s)."""
        return prefill_step_s(self.prefill_base_s, self.prefill_per_token_s, self.prefill_per_token_sq_s,
                              self.prefill_min_s, self.prefill_attention, self.prefill_token_buckets, chunks)

    def decode_duration(self, contexts: Sequence[int], shared_tokens: int = 0) -> float:
        """One decode step of the running requests whose contexts are `contexts` (decode_step_s)."""
        return decode_step_s(self.decode_base_s, self.decode_per_req_s, self.decode_per_kv_token_s,
                             self.decode_attention, contexts, shared_tokens)

    @property
    def answer_end_s(self) -> float:
        """sglang's work on an answer's end before it leaves (its detokenizer and tokenizer manager after
        request_finished_ts): the response hop less what the wire takes of it (a streamed token's hop). The
        real-time simulator sends an answer's end this long after its model finished the request, so that the
        client reads it response_hop_s after, as from sglang (docs/sim-server.md "Answer's end")."""
        return self.response_hop_s - TOKEN_HOP_S


def prefill_step_s(base: float, per_token: float, per_token_sq: float, min_s: float,
                   attention: PrefillAttention | None, buckets: Sequence[int],
                   chunks: Sequence[tuple[int, int]]) -> float:
    """One prefill step over `chunks` = [(tokens already prefilled, new tokens), ...], one per request:
    max(min, a + b * padded(new) + attention): the linear part (GEMMs) at the CUDA graph's padded token count,
    attention at the real one: q * sum((done + new)^2 - done^2), or with a prefill attention model
    t x makespan (prefill_attention_tokens)."""
    new = 0
    for _, take in chunks:
        new += take
    step = base + per_token * padded_tokens(new, buckets)
    if attention is None:
        pairs = 0
        for done, take in chunks:
            end = done + take
            pairs += end * end - done * done
        step += per_token_sq * pairs
    else:
        step += attention.token_s * prefill_attention_tokens(
            chunks, attention.slots, attention.program_overhead_tokens, attention.block_m, attention.block_n,
            attention.heads)
    return max(min_s, step)


def decode_step_s(base: float, per_req: float, per_kv_token: float, attention: DecodeAttention | None,
                  contexts: Sequence[int], shared_tokens: int) -> float:
    """One decode step of the running requests whose contexts (the KV each attends over, its new token included) are
    `contexts`, in the batch's order; `shared_tokens` of their KV are read through a prompt prefix that another
    running request holds too (the same radix-cache pages): c + d B + e KV, plus with an attention model
    t x makespan x (1 - shared_saving x shared / KV) + few_programs_token_s x longest x (1 - programs / few_programs)
    when there are fewer programs than few_programs (decode_attention_tokens)."""
    kv = sum(contexts)
    step = base + per_req * len(contexts) + per_kv_token * kv   # as BatchModel.start_decode_run's linear runs add it
    if attention is not None:
        span, programs, longest = decode_attention_tokens(
            contexts, attention.slots, attention.program_overhead_tokens, attention.kv_splits, attention.sm_count,
            attention.heads, attention.graph_batch_sizes)
        step += attention.token_s * span * (1.0 - attention.shared_saving * shared_tokens / kv)
        if programs < attention.few_programs:
            step += attention.few_programs_token_s * longest * (1.0 - programs / attention.few_programs)
    return step

def prefill_attention_tokens(chunks: Sequence[tuple[int, int]], slots: int, overhead: int, block_m: int,
                             block_n: int, heads: int) -> float:
    """The makespan of one prefill step's attention in tokens walked, max(all walks / slots, the longest walk).
    sglang's extend kernel runs a program per (request, head, block of block_m new tokens); block m of a request with
    `done` tokens in KV and `take` new walks ceil(done / block_n) x block_n prefix tokens, then its new tokens up to
    min(take, (m + 1) x block_m) rounded up to block_n (causal), plus `overhead`. A step of few programs takes as long
    as its longest walk; one of many, its walks shared over `slots` programs at once. Summed in closed form: blocks
    0..n-2 end at multiples of block_m, the last at `take`."""
    total = 0
    longest = 0
    for done, take in chunks:
        if take <= 0:
            continue
        blocks = -(-take // block_m)
        prefix = -(-done // block_n) * block_n + overhead
        last = -(-take // block_n) * block_n
        total += blocks * prefix + block_m * blocks * (blocks - 1) // 2 + last
        longest = max(longest, prefix + last)
    return max(heads * total / slots, float(longest))


def decode_kv_chunk(contexts: Sequence[int], max_splits: int, sm_count: int, heads: int,
                     graph_batch_sizes: Sequence[int]) -> int:
    """The KV chunk of sglang 0.5.17's triton decode attention for this batch (kernels/ops/attention/metadata.py
    get_num_kv_splits_triton, MHA): request i is split into ceil(context_i / chunk) programs per head. The batch runs
    as the smallest CUDA graph of at least its size, its padding rows of length 1 (decode_cuda_graph_runner.py,
    triton_backend.py get_cuda_graph_seq_len_fill_value), so a padded batch's shortest context is 1: contexts that
    differ (longest >= 1.25 x shortest) split the longest up to longest / shortest ways; a batch of few requests up to
    sm_count x log2(longest / 64) / (batch x heads) ways; at most max_splits."""
    size = len(contexts)
    longest = max(contexts)
    padded = size
    if graph_batch_sizes and size <= graph_batch_sizes[-1]:
        padded = graph_batch_sizes[bisect.bisect_left(graph_batch_sizes, size)]
    shortest = min(contexts) if padded == size else 1
    if longest * 8 < shortest * 10:
        shortest = longest
    splits_1 = min(-(-longest // shortest), max_splits)
    cores = int(sm_count * max(math.log2(longest / 64.0), 1.0))
    splits_2 = min(-(-cores // (padded * heads)), max_splits)
    return min(-(-longest // splits_1), -(-longest // splits_2))


def decode_attention_tokens(contexts: Sequence[int], slots: int, overhead: int, max_splits: int, sm_count: int,
                            heads: int, graph_batch_sizes: Sequence[int]) -> tuple[int, int, int]:
    """The makespan of one decode step's attention in tokens walked: (makespan, programs of all heads, longest
    program). sglang's triton kernel runs a program per (request, head, split), each walking its split of the
    request's KV (ceil(ceil(context / splits) / 32) x 32 tokens, the last split the rest), launched split-major
    then request; the GPU runs `slots` x heads of them at once, each taking the next as one ends. One head's programs
    on `slots` slots stand for all heads' on slots x heads (a greedy list schedule; a program costs its tokens +
    overhead)."""
    chunk = decode_kv_chunk(contexts, max_splits, sm_count, heads, graph_batch_sizes)
    plan = []
    programs = 0
    longest = 0
    for context in contexts:
        splits = -(-context // chunk)
        per = -(-(-(-context // splits)) // 32) * 32
        plan.append((context, splits, per))
        programs += splits
        longest = max(longest, min(per, context))
    if programs <= slots:   # every program starts at once
        return longest + overhead, programs * heads, longest + overhead
    free = [0] * slots
    for split in range(max_splits):
        for context, splits, per in plan:
            if split < splits:
                walk = min(per, context - per * split)
                if walk > 0:
                    heapq.heapreplace(free, free[0] + overhead + walk)
    return max(free), programs * heads, longest + overhead




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
    _check_fields(params, _PROFILE_FIELDS - {"name", "source"}, f"{path}: field 'params", optional=False)
    _check_finite(params, ("request_hop_s", "response_hop_s"), f"{path}: field 'params", above_zero=True)
    if params["response_hop_s"] < TOKEN_HOP_S:
        raise ConfigError(f"{path}: field 'params.response_hop_s': {params['response_hop_s']} is less than a streamed "
                          f"token's hop ({TOKEN_HOP_S} s): an answer's end cannot reach the client sooner than a token")
    buckets = params["prefill_token_buckets"]
    if not _ascending_positive_ints(buckets):
        raise ConfigError(f"{path}: field 'params.prefill_token_buckets': must be ascending positive integers")
    prefill_attention = load_prefill_attention(params["prefill_attention"], path)
    if prefill_attention is not None and params["prefill_per_token_sq_s"] != 0:
        raise ConfigError(f"{path}: field 'params.prefill_per_token_sq_s': must be 0 with a prefill_attention model "
                          "(it replaces the q term)")
    return Profile(name=raw["name"], source=raw["source"], **{
        **params, "prefill_token_buckets": tuple(buckets),
        "decode_attention": load_decode_attention(params["decode_attention"], path),
        "prefill_attention": prefill_attention})


_PREFILL_ATTENTION_FIELDS = {f for f in PrefillAttention.__dataclass_fields__}
# the integer fields of a prefill attention model, each with its least value
_PREFILL_ATTENTION_INTS = {"slots": 1, "program_overhead_tokens": 0, "block_m": 1, "block_n": 1, "heads": 1}


def _check_fields(raw: object, fields: set[str], field_: str, optional: bool = True) -> None:
    """A part of a profile (`field_` names it in errors; `optional`: it may be null, handled before): an object with
    exactly `fields` (ConfigError)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{field_}': must be {'null or ' if optional else ''}an object")
    missing = sorted(fields - set(raw))
    if missing:
        raise ConfigError(f"{field_}': lacks {', '.join(missing)}")
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ConfigError(f"{field_}': unknown {', '.join(unknown)}")


def _check_ints(raw: dict, lows: dict[str, int], field_: str) -> None:
    """Each field `key` of `lows` an integer >= lows[key] (ConfigError)."""
    for key, low in lows.items():
        if type(raw[key]) is not int or raw[key] < low:
            raise ConfigError(f"{field_}.{key}': must be an integer >= {low}")


def _check_finite(raw: dict, keys: Sequence[str], field_: str, above_zero: bool) -> None:
    """Each field of `keys` a finite number (> 0 when `above_zero`) (ConfigError)."""
    for key in keys:
        value = raw[key]
        if not isinstance(value, (int, float)) or not math.isfinite(value) or (above_zero and value <= 0):
            raise ConfigError(f"{field_}.{key}': must be a finite number{' > 0' if above_zero else ''}")


def _ascending_positive_ints(value: object) -> bool:
    """A JSON list of integers > 0 in ascending order (CUDA-graph sizes)."""
    return isinstance(value, list) and all(type(b) is int and b > 0 for b in value) and value == sorted(value)


def load_prefill_attention(raw: object, path: Path) -> PrefillAttention | None:
    """A profile's `params.prefill_attention`: null (the q term) or every PrefillAttention field."""
    if raw is None:
        return None
    _check_attention(raw, _PREFILL_ATTENTION_FIELDS, _PREFILL_ATTENTION_INTS, f"{path}: field 'params.prefill_attention")
    assert isinstance(raw, dict)
    return PrefillAttention(**raw)


def _check_attention(raw: object, fields: set[str], ints: dict[str, int], field_: str) -> None:
    """What an attention model (prefill or decode) must be: an object with exactly `fields`, the integer ones in
    `ints` at least their least value, and a `token_s` (time per token walked) > 0."""
    _check_fields(raw, fields, field_)
    assert isinstance(raw, dict)
    _check_ints(raw, ints, field_)
    _check_finite(raw, ("token_s",), field_, above_zero=True)


_ATTENTION_FIELDS = {f for f in DecodeAttention.__dataclass_fields__}
# the integer fields of a decode attention model, each with its least value
_DECODE_ATTENTION_INTS = {"slots": 1, "program_overhead_tokens": 0, "few_programs": 0, "kv_splits": 1, "sm_count": 1,
                          "heads": 1}


def load_decode_attention(raw: object, path: Path) -> DecodeAttention | None:
    """A profile's `params.decode_attention`: null (the linear decode step) or every DecodeAttention field."""
    if raw is None:
        return None
    field_ = f"{path}: field 'params.decode_attention"
    _check_attention(raw, _ATTENTION_FIELDS, _DECODE_ATTENTION_INTS, field_)
    assert isinstance(raw, dict)
    _check_finite(raw, ("few_programs_token_s", "shared_saving"), field_, above_zero=False)   # corrections: any sign
    sizes = raw["graph_batch_sizes"]
    if not _ascending_positive_ints(sizes):
        raise ConfigError(f"{field_}.graph_batch_sizes': must be ascending positive integers")
    return DecodeAttention(**{**raw, "graph_batch_sizes": tuple(sizes)})


def builtin_profiles() -> list[Profile]:
    """Every profile shipped in tracebench/sim/profiles/, by name."""
    return [load_profile(path.stem) for path in sorted(PROFILES_DIR.glob("*.json"))]


def profiles_of_gpu(gpu: str) -> list[Profile]:
    """The built-in profiles whose accelerator names `gpu`: every word of `gpu` (case-insensitive) is a word of the
    accelerator, so "H100", "h100 80gb" and "NVIDIA H100 80GB HBM3" name llama-2-7b-h100-triton's. One is a match;
    none or several, no match (the callers say so, or take none)."""
    words = gpu.lower().split()
    return [p for p in builtin_profiles() if words and set(words) <= set(p.accelerator.lower().split())]
