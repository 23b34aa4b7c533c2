"""Fit a sim-server timing profile to sglang measurements of one GPU and print the error per calibration point.

    python -m tracebench.sim.fit --calibration tests/data/sglang-0.5.17/calibration-h100.json.xz \
        --routing-runs reports/examples/h100-sim-vs-real/fit --name llama-2-7b-h100-triton [--write PATH]
    python -m tracebench.sim.fit --sglang-dir tests/data/sglang-0.5.17 \
        --routing-runs reports/examples/h200x2-routing --name llama-2-7b-h200-triton [--write PATH]

Inputs (real sglang 0.5.17 on one GPU model; docs/sim-server.md "Profiles" gives every parameter's source and error):
- a calibration document in bench/gpu/calibrate.py's layout (`--calibration`), or the H200 captures assembled into one
  (`--sglang-dir`, `h200_calibration`): `prefill` (one request at a time), `prefix` (the sequential prefix-cache series
  A-D and the Mooncake blocks F), `decode` (B streams of 512 in / 128 out; a point is used only where B streams really
  ran at once), `singles` (single answers' meta_info), `server_info`, `accelerator`;
- real routing runs on the same GPU (`--routing-runs`: a run folder or a folder of them): the decode cost per KV token
  `e`, the intake of an idle server, the plan lag, the prefill CUDA-graph buckets (their /server_info).

The model (model.Profile): prefill step = max(min, a + b * padded(new) + q * sum(end^2 - start^2)), `min` the median
of the steps of <= 256 new tokens, a, b, q least squares (relative error) on the steps of >= 1024 new tokens, one point
per shape (cached, new) at its median, at the GEMMs' padded token count. Decode step = c + d * batch + e * kv_tokens:
the decode sweep (context 512..640, mean 576) pins c and d + 576 e; `e` comes from the routing runs' decode windows
(each request with >= MIN_DECODE_TOKENS outputs: its window prefill_finished -> finished minus the prefill batches
inside it, over completion_tokens - 1 steps, at the window's mean batch and KV tokens, rebuilt from every request's
stamps on its server), closed-form least squares with c and d + 576 e held. queue_entry_s: received -> forward entry of
the routing runs' requests that found their server empty. plan_lag_s: over their requests that arrived while their
server only decoded and were prefilled alone, mean wait = 1.5 T - R. dispatch_s, output_s, client_overhead_s: the
singles' and the 1-token prefill points' stamps (medians). request_hop_s, response_hop_s: tracebench's client to
sglang on the routing runs (dispatch -> received, finished -> the answer's end read; medians).
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from tracebench.cleanup import write_atomic
from tracebench.errors import ConfigError, RunFolderError
from tracebench.report.load import ROW, is_run_folder, load_run, run_file
from tracebench.profiles import (DecodeAttention, PrefillAttention, Profile, decode_attention_tokens, decode_step_s,
                                  padded_tokens, prefill_attention_tokens, prefill_step_s)
from tracebench.sim.model import Limits, resolve_max_running_requests, simulate

LLAMA2_7B_KV_BYTES_PER_TOKEN = 2 * 32 * 4096 * 2   # K and V, 32 layers, hidden 4096, fp16
# HBM bandwidth of the GPUs with a profile (datasheets: H200 4.8 TB/s, H100 SXM 80GB HBM3 3.35 TB/s): only for the
# report's physical lower bound of e (a batch reads every KV token once per decode step)
HBM_BYTES_PER_S = {"NVIDIA H200": 4.8e12, "NVIDIA H100 80GB HBM3": 3.35e12}
DECODE_INPUT, DECODE_OUTPUT = 512, 128            # the decode series: B streams of 512 in / 128 out
DECODE_MEAN_CONTEXT = DECODE_INPUT + DECODE_OUTPUT // 2   # 576: the mean context over the 128 decode steps
MIN_DECODE_TOKENS = 16                            # shorter decode windows are dominated by their edges
ARRIVAL_MARGIN_S = 0.003                          # plan lag: an arrival this close to a prefill step is left out
MIN_DECODE_ARRIVALS = 50
# bench/gpu/calibrate.py as of a604eb7 (the H100 calibration) opened its streams through one aiohttp session with the
# default connector, which holds at most 100 connections: its decode points of B > 100 ran at most 100 streams at once
# (H100: ITL 21.3 ms at "128" and 21.2 ms at "256", both below the line through B <= 64). A document that does not say
# its client's stream limit (`client.max_streams`, null: none) was made by that version.
CALIBRATE_A604EB7_MAX_STREAMS = 100
STAMPS = ("server_received", "server_forward_entry", "server_prefill_finished", "server_finished", "completion_tokens",
          "input_len", "server", "t_dispatch", "t_finish")
CALIBRATION_KEYS = ("prefill", "decode", "prefix", "singles", "server_info", "accelerator")
PREFIX_SERIES = ("A_shared_prefix_seq", "B_unique_seq", "C_partial", "D_after_flush")


def read_json_file(path: Path, flag: str) -> Any:
    """The JSON document in the file `flag` names; .xz: compressed, as the repository keeps them
    (tests/data/sglang-0.5.17/calibration-h100.json.xz)."""
    if not path.is_file():
        raise ConfigError(f"{flag} {path}: no such file")
    data = path.read_bytes()
    if path.suffix == ".xz":
        try:
            data = lzma.decompress(data)
        except (lzma.LZMAError, EOFError) as err:
            raise ConfigError(f"{path}: not a whole xz file ({err})") from err
    try:
        return json.loads(data)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not valid JSON: {err}") from err


def load_calibration(path: Path) -> dict:
    """A calibration document as bench/gpu/calibrate.py writes it, with `source` (what made it, for the profile's
    source line) and `max_streams` (the client's limit on streams at once) filled in."""
    doc = read_json_file(path, "--calibration")
    for key in CALIBRATION_KEYS:
        if key not in doc:
            raise ConfigError(f"{path}: field '{key}': missing (not a bench/gpu/calibrate.py document?)")
    info = doc["server_info"]
    for key in ("max_total_num_tokens", "version", "attention_backend"):
        if info.get(key) is None:
            raise ConfigError(f"{path}: field 'server_info.{key}': missing")
    client = doc.get("client")
    max_streams = CALIBRATE_A604EB7_MAX_STREAMS if client is None else client["max_streams"]
    source = (f"sglang {info['version']} {path.name.removesuffix('.xz')} (bench/gpu/calibrate.py: llama-2-7b-hf, "
              f"{info['attention_backend']} attention, one {doc['accelerator']})")
    return {**doc, "source": source, "max_streams": max_streams}


def h200_calibration(sglang_dir: Path) -> dict:
    """The H200 captures of `sglang_dir` (tests/data/sglang-0.5.17: calibration.json, prefix-cache-h200.json,
    api_capture.json) as one calibration document in bench/gpu/calibrate.py's layout. Their decode series ran every
    stream at once (ITL linear up to B = 256)."""
    calibration = json.loads((sglang_dir / "calibration.json").read_text())
    capture = json.loads((sglang_dir / "api_capture.json").read_text())
    prefix_cache = json.loads((sglang_dir / "prefix-cache-h200.json").read_text())
    singles = [json.loads(capture[k]["body"])["meta_info"] for k in ("generate_ids_nonstream", "generate_text_nonstream")]
    stream_last = capture["generate_stream_raw"]["last_lines"]
    singles.append(json.loads(next(line for line in stream_last if "\"e2e_latency\"" in line)[6:])["meta_info"])
    return {
        "prefill": calibration["prefill"], "decode": calibration["decode"],
        "prefix": {k: v for k, v in prefix_cache.items() if k != "server_info"},
        "singles": singles, "server_info": prefix_cache["server_info"], "accelerator": "NVIDIA H200",
        "max_streams": None,
        "source": "sglang 0.5.17 calibration.json, prefix-cache-h200.json and api_capture.json (llama-2-7b-hf, "
                  "dummy weights, triton attention, one H200)",
    }


@dataclass(frozen=True)
class RoutingRun:
    """The ok requests of one real-sglang run folder (requests.jsonl records with every stamp the fit reads)."""

    name: str
    servers: str          # e.g. "2 x NVIDIA H200", from run.json
    records: list[dict[str, Any]]
    prefill_token_buckets: tuple[int, ...]   # the servers' prefill CUDA-graph buckets (/server_info)
    decode_graph_batch_sizes: tuple[int, ...]   # their decode CUDA-graph batch sizes (/server_info)


@dataclass(frozen=True)
class DecodeWindows:
    """Per request of a routing run: decode steps in its window, mean measured decode step (s), mean batch, mean KV."""

    steps: np.ndarray
    step_s: np.ndarray
    batch: np.ndarray
    kv_tokens: np.ndarray


def load_routing_runs(folder: Path) -> list[RoutingRun]:
    """`folder` itself when it is a run folder, else every run folder under it (sorted by name); each replayed on
    real sglang and completed."""
    if not folder.is_dir():
        raise ConfigError(f"--routing-runs {folder}: no such folder")
    runs = []
    run_dirs = [folder] if is_run_folder(folder) else sorted(p for p in folder.iterdir() if is_run_folder(p))
    for run_dir in run_dirs:  # as replay wrote it or packed
        run = load_run(run_dir)
        meta = run.meta
        if meta["backend"] not in ("sglang", "attach") or meta["speed"] is not None:
            raise RunFolderError(str(run_file(run_dir, "run.json")), None, "backend",
                                 f"{meta['backend']!r} (speed {meta['speed']}): the fit needs runs on real sglang")
        if meta["status"] != "completed":
            raise RunFolderError(str(run_file(run_dir, "run.json")), None, "status", f"{meta['status']!r}, not completed")
        records = []
        # a run recorded before cached_tokens existed has none; its hits are 0 when its trace shares no prefix
        # (random ids per request: sglang's radix cache matches nothing)
        no_prefix = meta["trace"].get("prefix") is None
        for rec in run.requests.filter(pl.col("status") == "ok").iter_rows(named=True):
            for key in STAMPS:
                if rec[key] is None:
                    raise RunFolderError(str(run_file(run_dir, "requests.jsonl")), rec[ROW] + 1, key,
                                         "missing in an ok record (run without --enable-metrics?)")
            if rec["cached_tokens"] is None:
                if not no_prefix:
                    raise RunFolderError(str(run_file(run_dir, "requests.jsonl")), rec[ROW] + 1, "cached_tokens",
                                         "missing, and the trace shares prefixes: the prefill cost is unknown")
                rec = {**rec, "cached_tokens": 0}
            records.append(rec)
        accelerators = sorted({str(server.get("accelerator")) for server in meta["servers"]})
        where = str(run_file(run_dir, "run.json"))
        runs.append(RoutingRun(run_dir.name, f"{len(meta['servers'])} x {'/'.join(accelerators)}", records,
                               prefill_buckets(meta, where), decode_batch_sizes(meta, where)))
    if not runs:
        raise ConfigError(f"--routing-runs {folder}: no run folder (with run.json) in it")
    return runs


def _graph_sizes(meta: dict, where: str, part: str, sizes: Callable[[int, dict], tuple[int, ...]]) -> tuple[int, ...]:
    """What `sizes(i, config)` reads from /server_info cuda_graph_config.<part> of every server i of a run: the same
    for all of them."""
    found = set()
    for i, server in enumerate(meta["servers"]):
        config = ((server.get("server_info") or {}).get("cuda_graph_config") or {}).get(part)
        if not isinstance(config, dict):
            raise RunFolderError(where, None, f"servers[{i}].server_info.cuda_graph_config.{part}", "missing")
        found.add(sizes(i, config))
    if len(found) != 1:
        raise RunFolderError(where, None, f"servers[].server_info.cuda_graph_config.{part}.bs", "differs between servers")
    return found.pop()


def prefill_buckets(meta: dict, where: str) -> tuple[int, ...]:
    """The prefill CUDA-graph token buckets every server of a run reported in /server_info (the default breakable
    backend: tokens padded up to a bucket; disabled: no padding)."""
    def buckets(i: int, prefill: dict) -> tuple[int, ...]:
        if prefill["backend"] not in ("breakable", "disabled"):
            raise RunFolderError(where, None, f"servers[{i}].server_info.cuda_graph_config.prefill.backend",
                                 f"{prefill['backend']!r}: the simulator models breakable (or disabled) prefill graphs")
        return tuple(prefill["bs"]) if prefill["backend"] == "breakable" else ()

    return _graph_sizes(meta, where, "prefill", buckets)


def decode_batch_sizes(meta: dict, where: str) -> tuple[int, ...]:
    """The decode CUDA-graph batch sizes every server of a run reported in /server_info (a decode batch runs padded to
    the smallest of at least its size; none: eager, unpadded)."""
    return _graph_sizes(meta, where, "decode",
                        lambda _, decode: tuple(decode["bs"]) if decode["backend"] != "disabled" else ())


def idle_intake(run: RoutingRun) -> list[float]:
    """received -> forward entry of the requests that found their server empty (no other request received and not
    yet finished there): sglang's intake of a request when its scheduler is idle."""
    out = []
    for server in sorted({r["server"] for r in run.records}):
        mine = sorted((r for r in run.records if r["server"] == server), key=lambda r: r["server_received"])
        for r in mine:
            t = r["server_received"]
            if not any(o is not r and o["server_received"] <= t < o["server_finished"] for o in mine):
                out.append(r["server_forward_entry"] - t)
    return out


def http_hops(runs: list[RoutingRun]) -> tuple[float, float]:
    """(request, response) HTTP hops of tracebench's client to sglang, p50 over every ok request of the routing runs:
    t_dispatch -> sglang's request_received_ts, and its request_finished_ts -> the client's read of the answer's end
    (t_finish). The calibration's client is another program (its client_overhead_s is smaller on H100: 2.0 ms against
    these runs' 2.3 + 0.9)."""
    request = [rec["server_received"] - rec["t_dispatch"] for run in runs for rec in run.records]
    response = [rec["t_finish"] - rec["server_finished"] for run in runs for rec in run.records]
    return float(statistics.median(request)), float(statistics.median(response))


def decode_arrivals(run: RoutingRun, prefill_cost: Callable[[int, int], float],
                    decode_cost: Callable[[list[float]], float], queue_entry: float) -> tuple[np.ndarray, np.ndarray]:
    """The requests that arrived while their server only decoded and were then prefilled alone: each one's wait for
    its prefill step (received -> prefill finished, minus its intake and its prefill's modelled cost) and the
    modelled decode step at its arrival (the batch's contexts from every request's stamps on that server)."""
    waits, steps = [], []
    for server in sorted({r["server"] for r in run.records}):
        mine = [r for r in run.records if r["server"] == server]
        rec = np.array([r["server_received"] for r in mine])
        fe = np.array([r["server_forward_entry"] for r in mine])
        pf = np.array([r["server_prefill_finished"] for r in mine])
        fin = np.array([r["server_finished"] for r in mine])
        inp = np.array([r["input_len"] for r in mine])
        out = np.array([r["completion_tokens"] for r in mine])
        cached = np.array([r["cached_tokens"] for r in mine])
        for i, t in enumerate(rec):
            others = np.arange(len(mine)) != i
            decoding = others & (pf <= t) & (fin > t)
            near_prefill = others & (fe <= t + ARRIVAL_MARGIN_S) & (pf > t - ARRIVAL_MARGIN_S)
            waiting = others & (rec < t) & (fe > t)
            prefill_before = others & (fe > t) & (fe < fe[i])
            if (not decoding.any() or near_prefill.any() or waiting.any() or prefill_before.any()
                    or (fe == fe[i]).sum() > 1):
                continue
            contexts = [float(inp[j] + (t - pf[j]) / (fin[j] - pf[j]) * out[j]) for j in np.flatnonzero(decoding)]
            waits.append(pf[i] - t - queue_entry - prefill_cost(int(cached[i]), int(inp[i] - cached[i])))
            steps.append(decode_cost(contexts))
    return np.array(waits), np.array(steps)


def decode_windows(run: RoutingRun, prefill_cost: Callable[[list[int]], float]) -> DecodeWindows:
    """Each request's mean decode step over its decode window, with the window's mean batch size and KV tokens."""
    steps, step_s, batch, kv = [], [], [], []
    for server in sorted({r["server"] for r in run.records}):
        mine = [r for r in run.records if r["server"] == server]
        entry = np.array([r["server_forward_entry"] for r in mine])
        start = np.array([r["server_prefill_finished"] for r in mine])
        end = np.array([r["server_finished"] for r in mine])
        out = np.array([r["completion_tokens"] for r in mine], dtype=float)
        inp = np.array([r["input_len"] for r in mine], dtype=float)
        # prefill batches: sglang stamps one forward_entry_time for every request of a batch
        batches: dict[float, list[int]] = {}
        for i, t in enumerate(entry):
            batches.setdefault(float(t), []).append(i)
        batch_end = np.array([start[b[0]] for b in batches.values()])
        batch_cost = np.array([prefill_cost([int(inp[i]) for i in b]) for b in batches.values()])
        # overlap of window i (rows) with request j's decoding (columns), and the KV tokens j holds there (integral)
        lo = np.maximum(start[:, None], start[None, :])
        hi = np.minimum(end[:, None], end[None, :])
        overlap = np.clip(hi - lo, 0.0, None)
        grow = out / (end - start)   # tokens per second while decoding
        grown = np.where(overlap > 0, grow[None, :] * ((hi - start[None, :]) ** 2 - (lo - start[None, :]) ** 2) / 2, 0.0)
        width = end - start
        mean_batch = overlap.sum(axis=1) / width
        mean_kv = (inp[None, :] * overlap + grown).sum(axis=1) / width
        prefills = np.array([batch_cost[(batch_end > start[i]) & (batch_end <= end[i])].sum() for i in range(len(mine))])
        keep = out >= MIN_DECODE_TOKENS
        steps.append(out[keep] - 1)
        step_s.append((width - prefills)[keep] / (out[keep] - 1))
        batch.append(mean_batch[keep])
        kv.append(mean_kv[keep])
    return DecodeWindows(*(np.concatenate(x) for x in (steps, step_s, batch, kv)))




@dataclass(frozen=True)
class DecodePoint:
    """One measured decode step of a decode grid file (bench/gpu/decode_grid.py, decode_more.py)."""

    family: str                  # the file's family (grid, small, shared, mixed)
    label: str
    contexts: tuple[int, ...]    # each request's context at the window's middle: input + the tokens it then holds
    shared: int                  # KV tokens read through a prefix another request of the batch holds too
    step_s: float                # the mean decode step in the window where all of them decode (the client's)


# llama-2-7b's query heads, and the SMs of the GPUs with a profile (sglang's device_core_count)
LLAMA2_7B_HEADS = 32
# sglang 0.5.17's extend attention on Hopper, head dim 128 (extend_attention.py _get_block_sizes_for_extend_attention)
EXTEND_BLOCK_M = 128
EXTEND_BLOCK_N = 64
PREFILL_ATTENTION_SLOTS = tuple(range(132, 529, 22))   # programs at once: 1 ... 4 per SM of 132
PREFILL_ATTENTION_OVERHEADS = (0, 32, 64, 128, 256)
# the shapes the prefill attention is fitted to: fresh prompts of >= 512 tokens (shorter ones are launch-bound: the
# prefill_min floor) and >= 128 new tokens behind a cached prefix of >= 1,024 (the attention's walk is long)
PREFILL_ATTENTION_MIN_NEW = 512
SINGLE_PREFILL_SERIES = ("fresh", "behind_prefix")   # a grid file's prefill points of one request per step
PREFILL_BEHIND_PREFIX_MIN = (1024, 128)
SM_COUNT = {"NVIDIA H200": 132, "NVIDIA H100 80GB HBM3": 132}
# the decode attention's shape constants are chosen on a grid (the rest is least squares at each)
ATTENTION_SLOTS = tuple(range(16, 25))
ATTENTION_OVERHEADS = (0, 8, 16, 24, 32)
FEW_PROGRAMS = (256, 300, 384, 512)


@dataclass(frozen=True)
class DecodeGrid:
    """The measured decode steps of one GPU model (decode grid files), for the decode attention's fit."""

    sources: tuple[str, ...]     # the files' source lines
    accelerator: str
    kv_splits: int               # the server's --triton-attention-num-kv-splits
    points: tuple[DecodePoint, ...]
    left_out: tuple[str, ...]    # points without a measurement (no full-batch window), named
    # single prefill steps the files measured (decode_more.py's `prefill`: fresh and behind a cached prefix):
    # (series, tokens cached, new tokens, seconds), as prefill_points
    prefill: tuple[tuple[str, int, int, float], ...]


def load_decode_grid(paths: list[Path]) -> DecodeGrid:
    """Decode grid files (bench/gpu/decode_grid.py's, decode_more_pack.py's; .xz), of one GPU model and one KV split
    setting; a point with no sglang log step (no full-batch window: not a measurement) is left out and named."""
    sources, heads, points, left_out, prefill = [], set(), [], [], []
    for path in paths:
        doc = read_json_file(path, "--decode-grid")
        for key in ("source", "accelerator", "server_info"):
            if key not in doc:
                raise ConfigError(f"{path}: field '{key}': missing (not a decode grid file?)")
        sources.append(doc["source"])
        heads.add((doc["accelerator"], doc["server_info"]["triton_attention_num_kv_splits"]))
        families = doc["families"] if "families" in doc else {"grid": {"points": doc["points"]}}
        for family, part in families.items():
            for p in part["points"]:
                if p.get("sglang_log_step_s") is None:
                    left_out.append(f"{path.name} {family} {p['label']}")
                    continue
                contexts = tuple(int(round(n + p["mid_tokens"])) for n in p["lens"])
                shared = (len(p["lens"]) - len(set(p["groups"]))) * p["prefix"] if "groups" in p else 0
                points.append(DecodePoint(family, p["label"], contexts, shared, float(p["step_s"])))
        # single requests only: the `together_k` points of decode_more.py's prefix family share prefill steps
        prefill += [(f"grid {x['series']}", int(x["cached"]), int(x["ilen"]) - int(x["cached"]),
                     float(x["prefill"])) for x in doc.get("prefill", []) if x["series"] in SINGLE_PREFILL_SERIES]
    if len(heads) != 1:
        raise ConfigError(f"--decode-grid: the files differ in accelerator or KV splits ({sorted(heads)})")
    ((accelerator, kv_splits),) = heads
    return DecodeGrid(tuple(sources), accelerator, int(kv_splits), tuple(points), tuple(left_out), tuple(prefill))


def decode_graph_batch_sizes(runs: list[RoutingRun]) -> tuple[int, ...]:
    """The decode CUDA-graph batch sizes every server of the runs reported (/server_info cuda_graph_config.decode)."""
    sizes = {run.decode_graph_batch_sizes for run in runs}
    if len(sizes) != 1:
        raise ConfigError("the routing runs' servers differ in their decode CUDA-graph batch sizes: fit them apart")
    return sizes.pop()


def attention_terms(points: list[DecodePoint], slots: int, overhead: int, kv_splits: int, sm_count: int, heads: int,
                    graph_batch_sizes: tuple[int, ...]) -> np.ndarray:
    """Per point: batch size, makespan, shared / KV, programs, longest program (model.decode_attention_tokens)."""
    rows = []
    for p in points:
        span, programs, longest = decode_attention_tokens(p.contexts, slots, overhead, kv_splits, sm_count, heads,
                                                          graph_batch_sizes)
        rows.append((len(p.contexts), span, p.shared / sum(p.contexts), programs, longest))
    return np.array(rows, dtype=float)


def attention_design(terms: np.ndarray, few_programs: int) -> np.ndarray:
    """The decode step's design matrix: 1, B, makespan, makespan x shared / KV, longest x max(0, 1 - programs / few)."""
    batch, span, shared, programs, longest = terms.T
    return np.c_[np.ones_like(batch), batch, span, span * shared, longest * np.maximum(0.0, 1.0 - programs / few_programs)]


def fit_decode_attention(points: list[DecodePoint], kv_splits: int, sm_count: int, heads: int,
                         graph_batch_sizes: tuple[int, ...]) -> tuple[float, float, DecodeAttention]:
    """c, d and the attention of the decode step (model.Profile.decode_duration with e = 0): least squares of the
    relative error over every point at each shape (slots, program overhead, few programs) on a grid; the shape with
    the least RMS error wins."""
    y = np.array([p.step_s for p in points])
    best = None
    for slots in ATTENTION_SLOTS:
        for overhead in ATTENTION_OVERHEADS:
            terms = attention_terms(points, slots, overhead, kv_splits, sm_count, heads, graph_batch_sizes)
            for few in FEW_PROGRAMS:
                design = attention_design(terms, few)
                coef = np.linalg.lstsq(design / y[:, None], np.ones_like(y), rcond=None)[0]
                err = float(np.sqrt(((design @ coef / y - 1.0) ** 2).mean()))
                if best is None or err < best[0]:
                    best = (err, coef, slots, overhead, few)
    assert best is not None
    _, (c, d, t, t_shared, t_few), slots, overhead, few = best
    return float(c), float(d), DecodeAttention(
        token_s=float(t), slots=slots, program_overhead_tokens=overhead, few_programs=few,
        few_programs_token_s=float(t_few), shared_saving=float(-t_shared / t), kv_splits=kv_splits, sm_count=sm_count,
        heads=heads, graph_batch_sizes=graph_batch_sizes)


def fit_prefill_attention(shapes: dict[tuple[int, int], float], buckets: tuple[int, ...], floor: float
                          ) -> tuple[float, float, PrefillAttention]:
    """a, b and the attention of the prefill step (Profile.prefill_duration with q = 0) from single prefill steps
    `shapes` {(cached, new): seconds}: least squares of the relative error at each shape (slots, program overhead) on
    a grid, a held >= 0 (a fit that wants a fixed cost below 0 gets a = 0 and b, t refitted); the shape whose model,
    held to `floor` (prefill_min) as the simulator holds it, has the least RMS error wins."""
    keys = sorted(shapes)
    y = np.array([shapes[k] for k in keys])
    padded = np.array([padded_tokens(new, buckets) for _, new in keys], dtype=float)
    best = None
    for slots in PREFILL_ATTENTION_SLOTS:
        for overhead in PREFILL_ATTENTION_OVERHEADS:
            span = np.array([prefill_attention_tokens([(cached, new)], slots, overhead, EXTEND_BLOCK_M,
                                                      EXTEND_BLOCK_N, LLAMA2_7B_HEADS) for cached, new in keys])
            design = np.c_[np.ones_like(y), padded, span]
            coef = np.linalg.lstsq(design / y[:, None], np.ones_like(y), rcond=None)[0]
            if coef[0] < 0:
                coef = np.r_[0.0, np.linalg.lstsq(design[:, 1:] / y[:, None], np.ones_like(y), rcond=None)[0]]
            err = float(np.sqrt(((np.maximum(design @ coef, floor) / y - 1.0) ** 2).mean()))
            if best is None or err < best[0]:
                best = (err, coef, slots, overhead)
    assert best is not None
    _, (a, b, t), slots, overhead = best
    return float(a), float(b), PrefillAttention(token_s=float(t), slots=slots, program_overhead_tokens=overhead,
                                                block_m=EXTEND_BLOCK_M, block_n=EXTEND_BLOCK_N, heads=LLAMA2_7B_HEADS)


def prefill_points(calibration: dict) -> list[tuple[str, int, int, float]]:
    """Every measured single prefill step: (series, tokens already cached, new tokens, seconds)."""
    points = [("calibration", 0, p["ilen"], p["prefill"]) for p in calibration["prefill"]]
    prefix = calibration["prefix"]
    for series in PREFIX_SERIES:
        points += [(series, x["cached"], x["prompt"] - x["cached"], x["prefill_s"]) for x in prefix[series]]
    blocks = prefix["F_mooncake_blocks"]
    points += [("F_mooncake_blocks", c, p - c, t) for c, p, t in zip(blocks["cached"], blocks["prompt"],
                                                                       blocks["prefill_s"])]
    return points


def decode_points(calibration: dict) -> tuple[list[dict], list[tuple[dict, str]]]:
    """The decode series' points where B streams really ran at once, and the others with the reason they are not."""
    kept, dropped = [], []
    capacity = calibration["server_info"]["max_total_num_tokens"]
    limit = calibration["max_streams"]
    for d in calibration["decode"]:
        b = d["batch"]
        if limit is not None and b > limit:
            dropped.append((d, f"the client ran at most {limit} streams at once"))
        elif b * (DECODE_INPUT + DECODE_OUTPUT) > capacity:
            dropped.append((d, f"{b} x {DECODE_INPUT + DECODE_OUTPUT} tokens exceed the KV pool ({capacity})"))
        else:
            kept.append(d)
    return kept, dropped


def fit(calibration: dict, routing_runs: list[RoutingRun], name: str, decode_grid: DecodeGrid | None) -> Profile:
    """Fit the profile. Pure: takes the calibration document (load_calibration / h200_calibration), the routing
    runs' records and the decode grid (None: the decode step is c + d B + e KV from the calibration's decode sweep
    and the routing runs), returns the profile."""
    prefill = calibration["prefill"]
    if not routing_runs:
        raise ConfigError("the fit needs at least one routing run (decode at longer contexts) to split d from e")
    buckets = {run.prefill_token_buckets for run in routing_runs}
    if len(buckets) != 1:
        raise ConfigError("the routing runs' servers differ in their prefill CUDA-graph buckets: fit them apart")
    (token_buckets,) = buckets
    a, b, q, prefill_min, prefill_attention = _fit_prefill(calibration, token_buckets, decode_grid)

    def prefill_chunks(chunks: list[tuple[int, int]]) -> float:
        return prefill_step_s(a, b, q, prefill_min, prefill_attention, token_buckets, chunks)

    def prefill_cost(ilens: list[int]) -> float:
        return prefill_chunks([(0, n) for n in ilens])

    c, d, e, attention = _fit_decode(calibration, routing_runs, decode_grid, prefill_cost)

    def decode_cost(contexts: list[float]) -> float:
        if attention is None:
            return c + d * len(contexts) + e * sum(contexts)
        return decode_step_s(c, d, e, attention, [int(round(x)) for x in contexts], 0)

    # the calibration's requests follow each other closely (each sent when the last answered), so their intake
    # includes the scheduler's idle checks after the last one (scheduler.py on_idle); a trace's request that finds the
    # server idle arrived long after: its intake is measured on the routing runs
    idle = [t for run in routing_runs for t in idle_intake(run)]
    if len(idle) < 2:
        raise ConfigError(f"the routing runs have {len(idle)} request(s) that found their server idle: the fit needs "
                          "at least 2 to measure the intake of an idle server (queue_entry_s)")
    queue_entry = statistics.median(idle)
    # R: with requests arriving uniformly within decode steps of T, a request ready within R of a step's start joins
    # the next step, the rest the one after: the mean wait is 1.5 T - R
    waits, decode_steps = (np.concatenate(x) for x in zip(*(decode_arrivals(
        run, lambda cached, n: prefill_chunks([(cached, n)]),
        decode_cost, queue_entry) for run in routing_runs)))
    if waits.size < MIN_DECODE_ARRIVALS:
        raise ConfigError(f"the routing runs have {waits.size} requests that arrived during decode and were prefilled "
                          f"alone: the fit needs at least {MIN_DECODE_ARRIVALS} to measure the plan lag")
    plan_lag = float(1.5 * decode_steps.mean() - waits.mean())
    singles = calibration["singles"]
    intake_close = statistics.median(m["forward_entry_time"] - m["request_received_ts"] - m["queue_time"] for m in singles)
    dispatch = statistics.median(m["api_server_dispatch_finish_ts"] - m["request_received_ts"] for m in singles)
    output = statistics.median(p["server_e2e"] - p["prefill"] - p["queue_time"] for p in prefill) - intake_close
    client = statistics.median(p["client_e2e"] - p["server_e2e"] for p in prefill)
    request_hop, response_hop = http_hops(routing_runs)

    return Profile(
        name=name,
        prefill_base_s=float(a), prefill_per_token_s=float(b), prefill_per_token_sq_s=float(q),
        prefill_min_s=prefill_min, prefill_attention=prefill_attention,
        decode_base_s=float(c), decode_per_req_s=float(d), decode_per_kv_token_s=float(e), decode_attention=attention,
        queue_entry_s=float(queue_entry), plan_lag_s=plan_lag, dispatch_s=float(dispatch), output_s=float(output),
        client_overhead_s=float(client), request_hop_s=request_hop, response_hop_s=response_hop,
        max_total_num_tokens=int(calibration["server_info"]["max_total_num_tokens"]), context_length=4096,
        chunked_prefill_size=8192, accelerator=calibration["accelerator"], prefill_token_buckets=token_buckets,
        source=(f"fitted by `python -m tracebench.sim.fit` to {calibration['source']} and, for the decode cost per "
                "KV token, the per-request stamps of real routing runs ("
                + ", ".join(f"{r.name}: {r.servers}" for r in routing_runs) + ")") if decode_grid is None else (
            f"fitted by `python -m tracebench.sim.fit` to {calibration['source']} (prefill, per-request overheads), "
            "the per-request stamps of real routing runs ("
            + ", ".join(f"{r.name}: {r.servers}" for r in routing_runs)
            + ") for the intake, the plan lag and the CUDA-graph sizes, and the decode step to decode grids: "
            + "; ".join(src.split(";")[0] for src in decode_grid.sources)),
    )


def _fit_prefill(calibration: dict, token_buckets: tuple[int, ...], decode_grid: DecodeGrid | None
                 ) -> tuple[float, float, float, float, Any]:
    """(a, b, q, prefill_min, prefill_attention): at least prefill_min, the median of the calibration's prefills of 256
    tokens or fewer. Without the decode grid's prefill steps: the prefill of n new tokens after `cached` ones costs
    a + b x (n padded to the CUDA-graph bucket) + q x ((cached + n)^2 - cached^2), fitted in relative error to the
    calibration's prefills of 1,024 tokens or more (prefill_attention None). With them (fresh to 4,089 tokens, behind
    cached prefixes of 1-3k) and the calibration's: the extend kernel's makespan in place of q (q = 0)."""
    points = prefill_points(calibration)
    prefill_min = float(np.median([seconds for _, _, new_tokens, seconds in points if new_tokens <= 256]))
    shapes: dict[tuple[int, int], list[float]] = {}
    if decode_grid is not None and decode_grid.prefill:
        for _, cached, new_tokens, seconds in (*points, *decode_grid.prefill):
            if new_tokens >= PREFILL_ATTENTION_MIN_NEW or (cached >= PREFILL_BEHIND_PREFIX_MIN[0]
                                                           and new_tokens >= PREFILL_BEHIND_PREFIX_MIN[1]):
                shapes.setdefault((cached, new_tokens), []).append(seconds)
        a, b, prefill_attention = fit_prefill_attention(
            {shape: statistics.median(times) for shape, times in shapes.items()}, token_buckets, prefill_min)
        return a, b, 0.0, prefill_min, prefill_attention
    for _, cached, new_tokens, seconds in points:
        shapes.setdefault((cached, new_tokens), []).append(seconds)
    done = np.array([shape[0] for shape in shapes], dtype=float)
    new = np.array([shape[1] for shape in shapes], dtype=float)
    t_prefill = np.array([statistics.median(times) for times in shapes.values()])
    long_ = new >= 1024
    pairs = (done + new) ** 2 - done ** 2
    padded = np.array([padded_tokens(int(n), token_buckets) for n in new], dtype=float)   # the GEMMs' token count
    design = np.c_[np.ones(long_.sum()), padded[long_], pairs[long_]] / t_prefill[long_, None]
    a, b, q = np.linalg.lstsq(design, np.ones(long_.sum()), rcond=None)[0]
    return a, b, q, prefill_min, None


def _fit_decode(calibration: dict, routing_runs: list[RoutingRun], decode_grid: DecodeGrid | None,
                prefill_cost: Callable[[list[int]], float]) -> tuple[float, float, float, Any]:
    """(c, d, e, attention) of the decode step: c + d B + e KV from the calibration's decode sweep and the routing
    runs' decode windows (attention None), or c + d B and the attention model fitted to the decode grid (e = 0)."""
    attention = None
    if decode_grid is None:
        decode, _ = decode_points(calibration)
        batch = np.array([d["batch"] for d in decode], dtype=float)
        itl = np.array([d["itl_p50_ms"] for d in decode], dtype=float) / 1e3
        design = np.c_[np.ones_like(batch), batch] / itl[:, None]
        c, slope = np.linalg.lstsq(design, np.ones_like(itl), rcond=None)[0]   # slope = d + DECODE_MEAN_CONTEXT * e
        w = [decode_windows(run, prefill_cost) for run in routing_runs]
        steps, step_s, mean_batch, mean_kv = (np.concatenate([getattr(x, f) for x in w])
                                              for f in ("steps", "step_s", "batch", "kv_tokens"))
        # model / measured - 1 = (c + slope * B + e * (KV - 576 B)) / step - 1: linear in e
        u = (mean_kv - DECODE_MEAN_CONTEXT * mean_batch) / step_s
        v = (c + slope * mean_batch) / step_s - 1.0
        e = float(-(steps * u * v).sum() / (steps * u * u).sum())
        d = slope - DECODE_MEAN_CONTEXT * e
    else:
        if decode_grid.accelerator != calibration["accelerator"]:
            raise ConfigError(f"--decode-grid: measured on {decode_grid.accelerator}, the calibration on "
                              f"{calibration['accelerator']}")
        if decode_grid.accelerator not in SM_COUNT:
            raise ConfigError(f"--decode-grid: no SM count known for {decode_grid.accelerator}")
        c, d, attention = fit_decode_attention(list(decode_grid.points), decode_grid.kv_splits,
                                               SM_COUNT[decode_grid.accelerator], LLAMA2_7B_HEADS,
                                               decode_graph_batch_sizes(routing_runs))
        e = 0.0

    return c, d, e, attention


def report(profile: Profile, calibration: dict, routing_runs: list[RoutingRun],
           decode_grid: DecodeGrid | None) -> list[str]:
    """The fit's error at every calibration point: step level, and whole runs of the decode scenarios; and the mean
    decode step of the routing runs, measured (as in the fit) and modelled, also with e at its physical lower bound."""
    lines = ["prefill (one request, server-side prefill time; median per series and shape)",
             f"  {'series':<20} {'cached':>6} {'new':>5} {'graph':>5} {'n':>3}  measured_ms  model_ms  error"]
    groups: dict[tuple[str, int, int], list[float]] = {}
    grid_prefill = decode_grid.prefill if decode_grid is not None else ()
    for series, done, new, seconds in (*prefill_points(calibration), *grid_prefill):
        groups.setdefault((series, done, new), []).append(seconds)
    for (series, done, new), times in groups.items():
        measured = statistics.median(times)
        model = profile.prefill_duration([(done, new)])
        graph = padded_tokens(new, profile.prefill_token_buckets)
        lines.append(f"  {series:<20} {done:6d} {new:5d} {graph:5d} {len(times):3d}  {measured * 1e3:11.2f}  {model * 1e3:8.2f}"
                     f"  {model / measured - 1:+6.1%}")
    lines += [f"decode (B streams of {DECODE_INPUT} in / {DECODE_OUTPUT} out, all sent at once; virtual-clock run of "
              "the model)",
              "  batch  ITL_p50 ms meas/model/err      TTFT_p50 ms meas/model/err        e2e_p50 s meas/model/err"]
    limits = Limits(resolve_max_running_requests(None, profile.max_total_num_tokens, profile.context_length),
                    profile.max_total_num_tokens, profile.chunked_prefill_size)
    kept, dropped = decode_points(calibration)
    for d in kept:
        b = d["batch"]
        step = profile.decode_duration([DECODE_MEAN_CONTEXT] * b)
        outs = simulate(profile, limits, [(0.0, DECODE_INPUT, DECODE_OUTPUT)] * b)
        ttft = statistics.median(o.ttft for o in outs)
        e2e = statistics.median(o.e2e for o in outs)
        lines.append(
            f"  {b:5d}  {d['itl_p50_ms']:7.2f} {step * 1e3:7.2f} {step * 1e3 / d['itl_p50_ms'] - 1:+6.1%}"
            f"   {d['ttft_p50_ms']:8.1f} {ttft * 1e3:8.1f} {ttft * 1e3 / d['ttft_p50_ms'] - 1:+6.1%}"
            f"   {d['e2e_p50']:6.3f} {e2e:6.3f} {e2e / d['e2e_p50'] - 1:+6.1%}")
    for d, why in dropped:
        lines.append(f"  {d['batch']:5d}  {d['itl_p50_ms']:7.2f}  (left out: {why})")
    if decode_grid is not None:
        return lines + decode_grid_report(profile, decode_grid)
    hbm = HBM_BYTES_PER_S.get(profile.accelerator)
    e_bound = None if hbm is None else LLAMA2_7B_KV_BYTES_PER_TOKEN / hbm
    bound_head = ("(no HBM bandwidth known for this accelerator)" if e_bound is None else
                  f"(e = HBM bound {e_bound * 1e6:.3f} us: model_ms  error)")
    lines += ["decode in the routing runs (mean decode step over requests' windows, weighted by steps)",
              f"  {'run':<22} {'requests':>8} {'batch':>6} {'kv/req':>7}  measured_ms  model_ms  error   {bound_head}"]
    for run in routing_runs:
        w = decode_windows(run, lambda ilens: profile.prefill_duration([(0, n) for n in ilens]))
        measured = float(np.average(w.step_s, weights=w.steps))
        model = float(np.average(profile.decode_base_s + profile.decode_per_req_s * w.batch
                                 + profile.decode_per_kv_token_s * w.kv_tokens, weights=w.steps))
        line = (f"  {run.name:<22} {w.steps.size:8d} {w.batch.mean():6.1f} {(w.kv_tokens / w.batch).mean():7.0f}"
                f"  {measured * 1e3:11.2f}  {model * 1e3:8.2f}  {model / measured - 1:+6.1%}")
        if e_bound is not None:
            d_bound = profile.decode_per_req_s + DECODE_MEAN_CONTEXT * (profile.decode_per_kv_token_s - e_bound)
            bound = float(np.average(profile.decode_base_s + d_bound * w.batch + e_bound * w.kv_tokens,
                                     weights=w.steps))
            line += f"                             {bound * 1e3:8.2f}  {bound / measured - 1:+6.1%}"
        lines.append(line)
    return lines


def decode_grid_report(profile: Profile, grid: DecodeGrid, shown: float = 0.03) -> list[str]:
    """The decode step's error on the decode grid: per family, and every point off by more than `shown`."""
    attention = profile.decode_attention
    assert attention is not None
    lines = [f"decode grid ({len(grid.points)} points; left out, no measurement: {', '.join(grid.left_out) or 'none'})",
             f"  attention: {attention.slots} programs per head at once ({attention.slots * attention.heads} in all), "
             f"program overhead {attention.program_overhead_tokens} tokens, {attention.token_s * 1e6:.3f} us per "
             f"makespan token, few programs < {attention.few_programs}: {attention.few_programs_token_s * 1e6:+.3f} "
             f"us per token of the longest, shared prefix saving {attention.shared_saving:.3f}",
             f"  {'family':<8} {'n':>3}  rms    min     max"]
    errors: dict[str, list[tuple[str, float, float, float]]] = {}
    for p in grid.points:
        model = profile.decode_duration(list(p.contexts), p.shared)
        errors.setdefault(p.family, []).append((p.label, p.step_s, model, model / p.step_s - 1))
    for family, rows in errors.items():
        err = np.array([r[3] for r in rows])
        lines.append(f"  {family:<8} {err.size:3d}  {np.sqrt((err ** 2).mean()):.1%}  {err.min():+.1%}  {err.max():+.1%}")
    everything = np.array([r[3] for rows in errors.values() for r in rows])
    lines.append(f"  {'all':<8} {everything.size:3d}  {np.sqrt((everything ** 2).mean()):.1%}  {everything.min():+.1%}  "
                 f"{everything.max():+.1%}")
    lines.append(f"  points off by more than {shown:.0%}: measured_ms  model_ms  error")
    for family, rows in errors.items():
        for label, measured, model, err in rows:
            if abs(err) > shown:
                lines.append(f"    {family:<7} {label:<26} {measured * 1e3:8.3f}  {model * 1e3:8.3f}  {err:+6.1%}")
    return lines


def profile_document(profile: Profile) -> dict:
    params = asdict(profile)
    name, source = params.pop("name"), params.pop("source")
    return {"name": name, "source": source, "params": params}


def profile_text(doc: dict) -> str:
    """The profile file: indented JSON with lists of numbers kept on one line."""
    text = json.dumps(doc, indent=2)
    return re.sub(r"\[\s+([-\d.e, \n]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--calibration", type=Path,
                        help="a calibration document written by bench/gpu/calibrate.py "
                             "(tests/data/sglang-0.5.17/calibration-h100.json)")
    source.add_argument("--sglang-dir", type=Path,
                        help="the H200 captures: a folder with calibration.json, prefix-cache-h200.json and "
                             "api_capture.json (tests/data/sglang-0.5.17)")
    parser.add_argument("--routing-runs", type=Path, required=True,
                        help="a run folder, or a folder of run folders, replayed on real sglang on the same GPU "
                             "(reports/examples/h200x2-routing, reports/examples/h100-sim-vs-real/fit)")
    parser.add_argument("--decode-grid", type=Path, action="append", default=[], metavar="FILE",
                        help="a decode grid file (repeatable; tests/data/sglang-0.5.17/decode-grid-h200.json.xz, "
                             "decode-more-h200.json.xz): the decode step's attention is fitted to it; without one, "
                             "the decode step is c + d B + e KV from the calibration's sweep and the routing runs")
    parser.add_argument("--name", required=True, help="the profile's name (llama-2-7b-h100-triton)")
    parser.add_argument("--write", type=Path, default=None, help="write the profile JSON here")
    opts = parser.parse_args(argv)
    if opts.calibration is not None:
        calibration = load_calibration(opts.calibration)
    else:
        calibration = h200_calibration(opts.sglang_dir)
    routing_runs = load_routing_runs(opts.routing_runs)
    decode_grid = load_decode_grid(opts.decode_grid) if opts.decode_grid else None
    profile = fit(calibration, routing_runs, opts.name, decode_grid)
    doc = profile_document(profile)
    print(json.dumps(doc["params"], indent=2))
    print("\n".join(report(profile, calibration, routing_runs, decode_grid)))
    if opts.write is not None:
        write_atomic(opts.write, profile_text(doc).encode())
        print(f"wrote {opts.write}")


if __name__ == "__main__":
    main()
