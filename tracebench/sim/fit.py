"""Fit a sim-server timing profile to sglang measurements and print the error per calibration point.

    python -m tracebench.sim.fit --sglang-dir tests/data/sglang-0.5.17 \
        --routing-runs reports/examples/h200x2-routing [--write tracebench/sim/profiles/NAME.json]

Inputs (what real sglang 0.5.17 measured, see that folder's README):
- calibration.json `prefill`: one request at a time, 1 output token; `prefill` = prefill_finished - forward_entry.
- prefix-cache-h200.json: requests sent one at a time with and without a cached prefix (its sequential series A, B,
  C, D and the Mooncake blocks F; not the burst E, whose stamps span batches): prefill steps of `prompt - cached` new
  tokens after `cached` ones.
- calibration.json `decode`: B concurrent streams of 512 in / 128 out; ITL, TTFT, e2e percentiles.
- api_capture.json: single /generate answers, for the per-request stamps (received -> queued, -> dispatched).
- the run folders of real routing runs (`--routing-runs`: a folder of run folders, every one of which was replayed on
  real sglang; the committed ones are `reports/examples/h200x2-routing/`, two H200 servers, Azure conversation
  lengths): their per-request sglang stamps, used for the decode cost per KV token `e` only.

The model (see model.Profile):
- prefill step = max(min, a + b * new_tokens + q * sum over requests of (end^2 - start^2)), start = tokens already
  in KV (a cached prefix or earlier chunks): short steps are launch-bound (a floor), long ones compute-bound (linear
  GEMMs plus quadratic attention). `min` is the median of the short steps (<= 256 new tokens); a, b, q are least
  squares (relative error) on the compute-bound ones (>= 1024 new tokens), from both files, one point per shape
  (cached, new) at its median time (so the 92 repeats of one Mooncake shape do not outweigh the rest).
- decode step = c + d * batch + e * kv_tokens. In the calibration every request has a context of 512..640 tokens
  (mean 576 over the 128 decode steps), so batch and kv_tokens are collinear: the ITL medians pin c and the
  per-request slope d + 576 e (least squares, relative error), not d and e apart. The routing runs split them: their
  requests hold ~1,100 tokens of context each, at batch sizes 8..24. For each of their requests with at least
  MIN_DECODE_TOKENS output tokens, on its server, the window prefill_finished -> finished holds (completion_tokens - 1)
  decode steps plus the prefill steps of the batches that finished inside it; its mean decode step is (window - those
  prefills, costed with the prefill fit above) / (completion_tokens - 1), at the window's mean batch size and mean KV
  tokens (reconstructed exactly from every request's stamps on that server: a request decodes from its
  prefill_finished to its finished stamp, holding input_len tokens plus its outputs so far, grown linearly). `e` is
  the closed-form least squares (relative error, weighted by decode steps) of those means with c and d + 576 e held
  to the calibration's values; d follows.
- per-request overheads: received -> in the waiting queue and received -> dispatched from the capture's stamps;
  token sampled -> visible to HTTP = server_e2e - prefill - queue_time - (received -> queued) on the 1-token points;
  client overhead = client_e2e - server_e2e (medians).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from tracebench.errors import ConfigError, RunFolderError
from tracebench.report.load import ROW, is_run_folder, load_run, run_file
from tracebench.sim.model import Limits, Profile, resolve_max_running_requests, simulate

LLAMA2_7B_KV_BYTES_PER_TOKEN = 2 * 32 * 4096 * 2   # K and V, 32 layers, hidden 4096, fp16
H200_HBM_BYTES_PER_S = 4.8e12
DECODE_MEAN_CONTEXT = 512 + 64                    # 512-token prompt, mean over the 128 decode steps
H200_MAX_TOTAL_NUM_TOKENS = 231818                # sglang's log and /server_info on the H200 (mem_fraction 0.904)
MIN_DECODE_TOKENS = 16                            # shorter decode windows are dominated by their edges
STAMPS = ("server_forward_entry", "server_prefill_finished", "server_finished", "completion_tokens", "input_len",
          "server")


@dataclass(frozen=True)
class RoutingRun:
    """The ok requests of one real-sglang run folder (requests.jsonl records with every stamp the fit reads)."""

    name: str
    servers: str          # e.g. "2 x NVIDIA H200", from run.json
    records: list[dict[str, Any]]


@dataclass(frozen=True)
class DecodeWindows:
    """Per request of a routing run: decode steps in its window, mean measured decode step (s), mean batch, mean KV."""

    steps: np.ndarray
    step_s: np.ndarray
    batch: np.ndarray
    kv_tokens: np.ndarray


def load_routing_runs(folder: Path) -> list[RoutingRun]:
    """Every run folder under `folder` (sorted by name), each replayed on real sglang and completed."""
    if not folder.is_dir():
        raise ConfigError(f"--routing-runs {folder}: no such folder")
    runs = []
    for run_dir in sorted(p for p in folder.iterdir() if is_run_folder(p)):  # as replay wrote it or packed
        run = load_run(run_dir)
        meta = run.meta
        if meta["backend"] not in ("sglang", "attach") or meta["speed"] is not None:
            raise RunFolderError(str(run_file(run_dir, "run.json")), None, "backend",
                                 f"{meta['backend']!r} (speed {meta['speed']}): the fit needs runs on real sglang")
        if meta["status"] != "completed":
            raise RunFolderError(str(run_file(run_dir, "run.json")), None, "status", f"{meta['status']!r}, not completed")
        records = []
        for rec in run.requests.filter(pl.col("status") == "ok").iter_rows(named=True):
            for key in STAMPS:
                if rec[key] is None:
                    raise RunFolderError(str(run_file(run_dir, "requests.jsonl")), rec[ROW] + 1, key,
                                         "missing in an ok record (run without --enable-metrics?)")
            records.append(rec)
        accelerators = sorted({str(server.get("accelerator")) for server in meta["servers"]})
        runs.append(RoutingRun(run_dir.name, f"{len(meta['servers'])} x {'/'.join(accelerators)}", records))
    if not runs:
        raise ConfigError(f"--routing-runs {folder}: no run folder (with run.json) in it")
    return runs


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


PREFIX_SERIES = ("A_shared_prefix_seq", "B_unique_seq", "C_partial", "D_after_flush")


def prefill_points(calibration: dict, prefix_cache: dict) -> list[tuple[str, int, int, float]]:
    """Every measured single prefill step: (series, tokens already cached, new tokens, seconds)."""
    points = [("calibration", 0, p["ilen"], p["prefill"]) for p in calibration["prefill"]]
    for series in PREFIX_SERIES:
        points += [(series, x["cached"], x["prompt"] - x["cached"], x["prefill_s"]) for x in prefix_cache[series]]
    blocks = prefix_cache["F_mooncake_blocks"]
    points += [("F_mooncake_blocks", c, p - c, t) for c, p, t in zip(blocks["cached"], blocks["prompt"],
                                                                       blocks["prefill_s"])]
    return points


def fit(calibration: dict, capture: dict, prefix_cache: dict, routing_runs: list[RoutingRun], name: str) -> Profile:
    """Fit the profile. Pure: takes the three JSON documents and the routing runs' records, returns the profile."""
    prefill = calibration["prefill"]
    points = prefill_points(calibration, prefix_cache)
    prefill_min = float(np.median([seconds for _, _, new_tokens, seconds in points if new_tokens <= 256]))
    shapes: dict[tuple[int, int], list[float]] = {}
    for _, cached, new_tokens, seconds in points:
        shapes.setdefault((cached, new_tokens), []).append(seconds)
    done = np.array([shape[0] for shape in shapes], dtype=float)
    new = np.array([shape[1] for shape in shapes], dtype=float)
    t_prefill = np.array([statistics.median(times) for times in shapes.values()])
    long_ = new >= 1024
    pairs = (done + new) ** 2 - done ** 2
    design = np.c_[np.ones(long_.sum()), new[long_], pairs[long_]] / t_prefill[long_, None]
    a, b, q = np.linalg.lstsq(design, np.ones(long_.sum()), rcond=None)[0]

    def prefill_cost(ilens: list[int]) -> float:
        return max(prefill_min, a + b * sum(ilens) + q * sum(n * n for n in ilens))

    decode = calibration["decode"]
    batch = np.array([d["batch"] for d in decode], dtype=float)
    itl = np.array([d["itl_p50_ms"] for d in decode], dtype=float) / 1e3
    design = np.c_[np.ones_like(batch), batch] / itl[:, None]
    c, slope = np.linalg.lstsq(design, np.ones_like(itl), rcond=None)[0]   # slope = d + DECODE_MEAN_CONTEXT * e
    if not routing_runs:
        raise ConfigError("the fit needs at least one routing run (decode at longer contexts) to split d from e")
    w = [decode_windows(run, prefill_cost) for run in routing_runs]
    steps, step_s, mean_batch, mean_kv = (np.concatenate([getattr(x, f) for x in w])
                                          for f in ("steps", "step_s", "batch", "kv_tokens"))
    # model / measured - 1 = (c + slope * B + e * (KV - 576 B)) / step - 1: linear in e
    u = (mean_kv - DECODE_MEAN_CONTEXT * mean_batch) / step_s
    v = (c + slope * mean_batch) / step_s - 1.0
    e = float(-(steps * u * v).sum() / (steps * u * u).sum())
    d = slope - DECODE_MEAN_CONTEXT * e

    singles = [json.loads(capture[k]["body"])["meta_info"] for k in ("generate_ids_nonstream", "generate_text_nonstream")]
    stream_last = capture["generate_stream_raw"]["last_lines"]
    singles.append(json.loads(next(l for l in stream_last if "\"e2e_latency\"" in l)[6:])["meta_info"])
    queue_entry = statistics.median(m["forward_entry_time"] - m["request_received_ts"] - m["queue_time"] for m in singles)
    dispatch = statistics.median(m["api_server_dispatch_finish_ts"] - m["request_received_ts"] for m in singles)
    output = statistics.median(p["server_e2e"] - p["prefill"] - p["queue_time"] for p in prefill) - queue_entry
    client = statistics.median(p["client_e2e"] - p["server_e2e"] for p in prefill)

    return Profile(
        name=name,
        prefill_base_s=float(a), prefill_per_token_s=float(b), prefill_per_token_sq_s=float(q),
        prefill_min_s=prefill_min,
        decode_base_s=float(c), decode_per_req_s=float(d), decode_per_kv_token_s=float(e),
        queue_entry_s=float(queue_entry), dispatch_s=float(dispatch), output_s=float(output),
        client_overhead_s=float(client),
        max_total_num_tokens=H200_MAX_TOTAL_NUM_TOKENS, context_length=4096,
        chunked_prefill_size=8192, accelerator="NVIDIA H200",
        source="fitted by `python -m tracebench.sim.fit` to sglang 0.5.17 calibration.json, prefix-cache-h200.json "
               "and api_capture.json (llama-2-7b-hf, dummy weights, triton attention, one H200) and, for the decode cost per KV token, the "
               "per-request stamps of real routing runs ("
               + ", ".join(f"{r.name}: {r.servers}" for r in routing_runs) + ")",
    )


def report(profile: Profile, calibration: dict, prefix_cache: dict, routing_runs: list[RoutingRun]) -> list[str]:
    """The fit's error at every calibration point: step level, and whole runs of the decode scenarios; and the mean
    decode step of the routing runs, measured (as in the fit) and modelled, also with e at its physical lower bound."""
    lines = ["prefill (one request, server-side prefill time; median per series and shape)",
             f"  {'series':<20} {'cached':>6} {'new':>5} {'n':>3}  measured_ms  model_ms  error"]
    groups: dict[tuple[str, int, int], list[float]] = {}
    for series, done, new, seconds in prefill_points(calibration, prefix_cache):
        groups.setdefault((series, done, new), []).append(seconds)
    for (series, done, new), times in groups.items():
        measured = statistics.median(times)
        model = profile.prefill_duration([(done, new)])
        lines.append(f"  {series:<20} {done:6d} {new:5d} {len(times):3d}  {measured * 1e3:11.2f}  {model * 1e3:8.2f}"
                     f"  {model / measured - 1:+6.1%}")
    lines += ["decode (B streams of 512 in / 128 out, all sent at once; virtual-clock run of the model)",
              "  batch  ITL_p50 ms meas/model/err      TTFT_p50 ms meas/model/err        e2e_p50 s meas/model/err"]
    limits = Limits(resolve_max_running_requests(None, profile.max_total_num_tokens, profile.context_length),
                    profile.max_total_num_tokens, profile.chunked_prefill_size)
    for d in calibration["decode"]:
        b = d["batch"]
        step = profile.decode_duration(b, b * DECODE_MEAN_CONTEXT)
        outs = simulate(profile, limits, [(0.0, 512, 128)] * b)
        ttft = statistics.median(o.ttft for o in outs)
        e2e = statistics.median(o.e2e for o in outs)
        lines.append(
            f"  {b:5d}  {d['itl_p50_ms']:7.2f} {step * 1e3:7.2f} {step * 1e3 / d['itl_p50_ms'] - 1:+6.1%}"
            f"   {d['ttft_p50_ms']:8.1f} {ttft * 1e3:8.1f} {ttft * 1e3 / d['ttft_p50_ms'] - 1:+6.1%}"
            f"   {d['e2e_p50']:6.3f} {e2e:6.3f} {e2e / d['e2e_p50'] - 1:+6.1%}")
    lines += ["decode in the routing runs (mean decode step over requests' windows, weighted by steps)",
              f"  {'run':<22} {'requests':>8} {'batch':>6} {'kv/req':>7}  measured_ms  model_ms  error"
              f"   (e = HBM bound {LLAMA2_7B_KV_BYTES_PER_TOKEN / H200_HBM_BYTES_PER_S * 1e6:.3f} us: model_ms  error)"]
    e_bound = LLAMA2_7B_KV_BYTES_PER_TOKEN / H200_HBM_BYTES_PER_S
    d_bound = profile.decode_per_req_s + DECODE_MEAN_CONTEXT * (profile.decode_per_kv_token_s - e_bound)
    for run in routing_runs:
        w = decode_windows(run, lambda ilens: profile.prefill_duration([(0, n) for n in ilens]))
        measured = float(np.average(w.step_s, weights=w.steps))
        model = float(np.average(profile.decode_base_s + profile.decode_per_req_s * w.batch
                                 + profile.decode_per_kv_token_s * w.kv_tokens, weights=w.steps))
        bound = float(np.average(profile.decode_base_s + d_bound * w.batch + e_bound * w.kv_tokens, weights=w.steps))
        lines.append(f"  {run.name:<22} {w.steps.size:8d} {w.batch.mean():6.1f} {(w.kv_tokens / w.batch).mean():7.0f}"
                     f"  {measured * 1e3:11.2f}  {model * 1e3:8.2f}  {model / measured - 1:+6.1%}"
                     f"                             {bound * 1e3:8.2f}  {bound / measured - 1:+6.1%}")
    return lines


def profile_document(profile: Profile) -> dict:
    params = asdict(profile)
    name, source = params.pop("name"), params.pop("source")
    return {"name": name, "source": source, "params": params}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang-dir", type=Path, required=True,
                        help="folder with calibration.json, prefix-cache-h200.json and api_capture.json "
                             "(tests/data/sglang-0.5.17)")
    parser.add_argument("--routing-runs", type=Path, required=True,
                        help="folder of run folders replayed on real sglang (reports/examples/h200x2-routing)")
    parser.add_argument("--name", default="llama-2-7b-h200-triton")
    parser.add_argument("--write", type=Path, default=None, help="write the profile JSON here")
    opts = parser.parse_args(argv)
    calibration = json.loads((opts.sglang_dir / "calibration.json").read_text())
    capture = json.loads((opts.sglang_dir / "api_capture.json").read_text())
    prefix_cache = json.loads((opts.sglang_dir / "prefix-cache-h200.json").read_text())
    routing_runs = load_routing_runs(opts.routing_runs)
    profile = fit(calibration, capture, prefix_cache, routing_runs, opts.name)
    doc = profile_document(profile)
    print(json.dumps(doc["params"], indent=2))
    print("\n".join(report(profile, calibration, prefix_cache, routing_runs)))
    if opts.write is not None:
        tmp = opts.write.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(opts.write)
        print(f"wrote {opts.write}")


if __name__ == "__main__":
    main()
