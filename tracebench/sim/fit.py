"""Fit a sim-server timing profile to sglang measurements and print the error per calibration point.

    python -m tracebench.sim.fit --sglang-dir ../shared/sglang-0.5.17 [--write tracebench/sim/profiles/NAME.json]

Inputs (what real sglang 0.5.17 measured, see that folder's README):
- calibration.json `prefill`: one request at a time, 1 output token; `prefill` = prefill_finished - forward_entry.
- calibration.json `decode`: B concurrent streams of 512 in / 128 out; ITL, TTFT, e2e percentiles.
- api_capture.json: single /generate answers, for the per-request stamps (received -> queued, -> dispatched).

The model (see model.Profile):
- prefill step = max(min, a + b * new_tokens + q * sum over requests of (end^2 - start^2)): short prompts are
  launch-bound (a floor), long ones compute-bound (linear GEMMs plus quadratic attention). `min` is the median of the
  short-prompt points (ilen <= 256); a, b, q are least squares (relative error) on the compute-bound points
  (ilen >= 1024).
- decode step = c + d * batch + e * kv_tokens. In the calibration every request has a context of 512..640 tokens, so
  batch and kv_tokens are collinear and the data cannot split d from e. We fix e from physics: each decode step reads
  every cached token's K and V once, 2 * layers * hidden * 2 bytes = 512 KiB per token for llama-2-7b in fp16, at the
  H200's 4.8 TB/s HBM bandwidth (a lower bound on attention's cost); c and d are then least squares (relative error)
  on the ITL medians with kv_tokens = batch * 576 (the mean context over 128 decode steps of a 512-token prompt).
- per-request overheads: received -> in the waiting queue and received -> dispatched from the capture's stamps;
  token sampled -> visible to HTTP = server_e2e - prefill - queue_time - (received -> queued) on the 1-token points;
  client overhead = client_e2e - server_e2e (medians).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict
from pathlib import Path

import numpy as np

from tracebench.sim.model import Limits, Profile, resolve_max_running_requests, simulate

LLAMA2_7B_KV_BYTES_PER_TOKEN = 2 * 32 * 4096 * 2   # K and V, 32 layers, hidden 4096, fp16
H200_HBM_BYTES_PER_S = 4.8e12
DECODE_MEAN_CONTEXT = 512 + 64                    # 512-token prompt, mean over the 128 decode steps
H200_MAX_TOTAL_NUM_TOKENS = 231818                # sglang's log and /server_info on the H200 (mem_fraction 0.904)


def fit(calibration: dict, capture: dict, name: str) -> Profile:
    """Fit the profile. Pure: takes the two JSON documents, returns the profile."""
    prefill = calibration["prefill"]
    ilen = np.array([p["ilen"] for p in prefill], dtype=float)
    t_prefill = np.array([p["prefill"] for p in prefill], dtype=float)

    short = ilen <= 256
    prefill_min = float(np.median(t_prefill[short]))
    long_ = ilen >= 1024
    design = np.c_[np.ones(long_.sum()), ilen[long_], ilen[long_] ** 2] / t_prefill[long_, None]
    a, b, q = np.linalg.lstsq(design, np.ones(long_.sum()), rcond=None)[0]

    decode = calibration["decode"]
    batch = np.array([d["batch"] for d in decode], dtype=float)
    itl = np.array([d["itl_p50_ms"] for d in decode], dtype=float) / 1e3
    e = LLAMA2_7B_KV_BYTES_PER_TOKEN / H200_HBM_BYTES_PER_S
    rest = itl - e * batch * DECODE_MEAN_CONTEXT
    design = np.c_[np.ones_like(batch), batch] / itl[:, None]
    c, d = np.linalg.lstsq(design, rest / itl, rcond=None)[0]

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
        source="fitted by `python -m tracebench.sim.fit` to sglang 0.5.17 calibration.json and api_capture.json "
               "(llama-2-7b-hf, dummy weights, triton attention, one H200)",
    )


def report(profile: Profile, calibration: dict) -> list[str]:
    """The fit's error at every calibration point: step level, and whole runs of the decode scenarios."""
    lines = ["prefill (one request, server-side prefill time)", "  ilen   measured_ms  model_ms  error"]
    for p in calibration["prefill"]:
        model = profile.prefill_duration([(0, p["ilen"])])
        lines.append(f"  {p['ilen']:5d}  {p['prefill'] * 1e3:10.2f}  {model * 1e3:8.2f}  {model / p['prefill'] - 1:+6.1%}")
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
    return lines


def profile_document(profile: Profile) -> dict:
    params = asdict(profile)
    name, source = params.pop("name"), params.pop("source")
    return {"name": name, "source": source, "params": params}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang-dir", type=Path, required=True,
                        help="folder with calibration.json and api_capture.json (../shared/sglang-0.5.17)")
    parser.add_argument("--name", default="llama-2-7b-h200-triton")
    parser.add_argument("--write", type=Path, default=None, help="write the profile JSON here")
    opts = parser.parse_args(argv)
    calibration = json.loads((opts.sglang_dir / "calibration.json").read_text())
    capture = json.loads((opts.sglang_dir / "api_capture.json").read_text())
    profile = fit(calibration, capture, opts.name)
    doc = profile_document(profile)
    print(json.dumps(doc["params"], indent=2))
    print("\n".join(report(profile, calibration)))
    if opts.write is not None:
        tmp = opts.write.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(opts.write)
        print(f"wrote {opts.write}")


if __name__ == "__main__":
    main()
