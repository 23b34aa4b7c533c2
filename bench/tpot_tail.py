"""Why a replay's TPOT tail differs from the real run's, request by request (issue 36).

    .venv/bin/python bench/tpot_tail.py REAL_RUN SIM_RUN [--top N] [--profile NAME_OR_PATH ...]
    .venv/bin/python bench/sim_vs_real.py --replay reports/examples/h200x4-routing/round_robin \\
        reports/examples/sim4-routing/azure4.jsonl.xz --out DIR --clock virtual
    .venv/bin/python bench/tpot_tail.py reports/examples/h200x4-routing/round_robin DIR/round_robin --top 16

SIM_RUN: the real run replayed (bench/sim_vs_real.py --replay, the virtual clock: deterministic), joined with it by
request id. For the real run's N requests of largest TPOT (the report's: (t_finish - t_first_token) /
(completion_tokens - 1)), one line each: its TPOT and decode window (sglang's prefill_finished -> finished, on its
server) in both runs; the prefill batches that finished inside that window on the same server (a batch: the requests
sharing one forward_entry), in both runs; and each `--profile`'s time for the real window's own content (its
completion_tokens - 1 decode steps at the batch the real stamps rebuild, step by step, plus those prefill batches).
The model on the real content near the real window while the replay's window is shorter: the replay put other
prefills in that request's window (which prefills land in which short window). The model short on the real content:
the cost model misses.

Then the /metrics scrapes: a real run made with `--metrics-interval S` asked every server's /metrics every S run
seconds, and sglang's HTTP process (its tokenizer manager) serves that page on its event loop, holding every
stream's tokens while it does (~16 ms a scrape on an H200 host: reports/examples/h200x2-telemetry). A stream whose
last token falls in that hold ends late (TPOT up); one whose first token does starts late (TPOT down). Every request
whose stream holds a scrape tick is listed, with its real stream (first -> last token, client side) less the replay's.
The ticks are at k x S of the run clock; runs made since 2026-11-29 (6a682af) put server i of N at (k + i/N) x S.
`--hold-ms D ...`: the replay's TPOT p50/p99 with such holds put on it afterwards (the simulator has none): a token
of a request on server i reaching the client within [tick + request_hop_s, tick + request_hop_s + D] + response_hop_s
(the profile's hops) reaches it at that window's end instead; which requests that holds. Not for PD runs (their
records carry no decode server's prefill_finished).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracebench.profiles import Profile, load_profile  # noqa: E402
from tracebench.report.load import COMPLETED_STATUSES, load_run  # noqa: E402
from tracebench.report.metrics.definitions import LATENCY  # noqa: E402
from tracebench.sim.catalog import profile_for_gpu  # noqa: E402

TPOT = next(m for m in LATENCY if m.key == "tpot")

# run.json wall_clock_start of the first runs whose /metrics scrapes were spread over the interval (commit 6a682af,
# 2026-11-29 00:35 UTC); the runs before scraped every server at the same tick
SCRAPES_SPREAD_SINCE = 1795912541.0
SAME_BATCH_S = 1e-5   # forward_entry stamps closer than this are one prefill batch (prefill_batches)


def completed(run_dir: Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The run's completed requests with their TPOT (None for one output token) and new prompt tokens, and run.json."""
    run = load_run(run_dir)
    requests = run.requests.filter(pl.col("status").is_in(COMPLETED_STATUSES)).with_columns(
        cached=pl.col("cached_tokens").fill_null(0), tpot=TPOT.expr)   # the report's own definition
    return requests, run.meta


def prefill_batches(server: pl.DataFrame, me: dict[str, Any]) -> list[list[tuple[int, int]]]:
    """The prefill batches of `server`'s requests that finished inside `me`'s decode window, each as its requests'
    (cached, new) prompt tokens, in the order they entered. One batch's requests share a forward_entry up to the
    stamps' float rounding (real sglang: 0.24 µs apart); two batches are a step (>= 1 ms) apart."""
    w0, w1 = me["server_prefill_finished"], me["server_finished"]
    inside = server.filter((pl.col("server_prefill_finished") > w0) & (pl.col("server_prefill_finished") < w1)
                           & (pl.col("id") != me["id"])).sort("server_forward_entry")
    batches: list[list[tuple[int, int]]] = []
    last_entry = -math.inf
    for other in inside.iter_rows(named=True):
        if other["server_forward_entry"] - last_entry > SAME_BATCH_S:
            batches.append([])
        last_entry = other["server_forward_entry"]
        batches[-1].append((other["cached"], other["prompt_tokens"] - other["cached"]))
    return batches


def modelled_window(profile: Profile, server: pl.DataFrame, me: dict[str, Any],
                    batches: list[list[tuple[int, int]]]) -> float:
    """`profile`'s time for the real window's content: its decode steps, each at the batch decoding at that step's
    share of the window (every request's context grown linearly over its own window), its prefill batches, and the
    last token's way to the HTTP layer (`output_s`: sglang stamps finished there, prefill_finished in the scheduler)."""
    w0, w1 = me["server_prefill_finished"], me["server_finished"]
    steps = me["completion_tokens"] - 1
    total = 0.0
    rows = server.select("prompt_tokens", "completion_tokens", "server_prefill_finished", "server_finished").rows()
    for k in range(steps):
        t = w0 + (k + 0.5) / steps * (w1 - w0)
        contexts = [prompt + max(1, int((t - start) / (end - start) * out))
                    for prompt, out, start, end in rows if start <= t < end]
        total += profile.decode_duration(contexts)
    return total + sum(profile.prefill_duration(batch) for batch in batches) + profile.output_s


def scrape_ticks(meta: dict[str, Any], server: int, lo: float, hi: float) -> list[float]:
    """The run times in [lo, hi] at which the real run asked server `server` for /metrics (none without a scraper)."""
    interval = meta["options"].get("metrics_interval")
    if not meta.get("server_metrics") or not interval:
        return []
    phase = server / len(meta["servers"]) if meta["wall_clock_start"] >= SCRAPES_SPREAD_SINCE else 0.0
    first = math.ceil(lo / interval - phase)
    return [(k + phase) * interval for k in range(first, math.floor(hi / interval - phase) + 1)]


def held_tpots(sim: pl.DataFrame, meta: dict[str, Any], profile: Profile, hold_s: float) -> tuple[pl.Series, list[int]]:
    """The replay's TPOTs with its first and last tokens held by the real run's scrapes as `hold_s` long holds of
    the server's hand-out (`--hold-ms`), and the requests whose TPOT that moved."""
    interval = meta["options"]["metrics_interval"]
    spread = meta["wall_clock_start"] >= SCRAPES_SPREAD_SINCE
    tpots, moved = [], []
    for req in sim.filter(pl.col("completion_tokens") > 1).iter_rows(named=True):
        phase = req["server"] / len(meta["servers"]) if spread else 0.0
        ends = []
        for t in (req["t_first_token"], req["t_finish"]):
            handed = t - profile.response_hop_s   # when the server's HTTP layer handed it out
            tick = (math.floor((handed - profile.request_hop_s) / interval - phase) + phase) * interval
            start = tick + profile.request_hop_s  # the scrape reaches the server a hop after its tick
            ends.append(start + hold_s + profile.response_hop_s if start <= handed <= start + hold_s else t)
        if ends != [req["t_first_token"], req["t_finish"]]:
            moved.append(req["id"])
        tpots.append((ends[1] - ends[0]) / (req["completion_tokens"] - 1))
    return pl.Series(tpots), moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("real", type=Path)
    parser.add_argument("sim", type=Path)
    parser.add_argument("--top", type=int, default=10, help="the real run's N largest TPOTs (default 10)")
    parser.add_argument("--profile", action="append", default=[], metavar="NAME_OR_PATH",
                        help="a profile to cost the real windows' content with (repeatable; default: the built-in "
                             "profile of the real run's GPU)")
    parser.add_argument("--hold-ms", type=float, nargs="+", default=[], metavar="D",
                        help="the replay's TPOT with the real run's /metrics scrapes held D ms each (repeatable values)")
    opts = parser.parse_args()
    real, meta = completed(opts.real)
    if meta.get("pd"):
        raise SystemExit(f"{opts.real}: a PD run: its records carry no decode server's prefill_finished (no window)")
    if opts.hold_ms and not meta.get("server_metrics"):
        raise SystemExit(f"{opts.real}: --hold-ms: the real run scraped no /metrics")
    sim, _ = completed(opts.sim)
    if opts.profile:
        profiles = {Path(name).stem: load_profile(name) for name in opts.profile}
    else:
        (gpu,) = {s["accelerator"] for s in meta["servers"]}
        profiles = {"built-in": profile_for_gpu(gpu)}
    by_id = {row["id"]: row for row in sim.iter_rows(named=True)}
    missing = set(real["id"].to_list()) - set(by_id)
    if missing:
        raise SystemExit(f"{opts.sim}: {len(missing)} completed requests of {opts.real} are not completed there")
    for name, frame in (("real", real), ("sim", sim)):
        tpot = frame["tpot"].drop_nulls()
        print(f"{name}: TPOT p50 {tpot.quantile(0.5, 'linear') * 1e3:.2f} ms, p99 {tpot.quantile(0.99, 'linear') * 1e3:.2f}"
              f" ms ({tpot.len()} requests)")
    print()
    print("| id | out | TPOT real | sim | window real | sim | prefills in it, real: batches, tokens | sim | "
          + " | ".join(f"{name} on the real content" for name in profiles) + " |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |" + " ---: |" * len(profiles))
    sums = dict.fromkeys(["real", "sim", *profiles], 0.0)
    servers = {s: real.filter(pl.col("server") == s) for s in real["server"].unique().to_list()}
    sim_servers = {s: sim.filter(pl.col("server") == s) for s in sim["server"].unique().to_list()}
    for me in real.sort("tpot", descending=True, nulls_last=True).head(opts.top).iter_rows(named=True):
        twin = by_id[me["id"]]
        mine, theirs = prefill_batches(servers[me["server"]], me), prefill_batches(sim_servers[twin["server"]], twin)
        window = me["server_finished"] - me["server_prefill_finished"]
        sim_window = twin["server_finished"] - twin["server_prefill_finished"]
        sums["real"] += window
        sums["sim"] += sim_window
        cells = []
        for name, profile in profiles.items():
            modelled = modelled_window(profile, servers[me["server"]], me, mine)
            sums[name] += modelled
            cells.append(f"{modelled * 1e3:.1f} ms ({modelled / window - 1:+.1%})")
        print(f"| {me['id']} | {me['completion_tokens']} | {me['tpot'] * 1e3:.1f} | {twin['tpot'] * 1e3:.1f} | "
              f"{window * 1e3:.1f} | {sim_window * 1e3:.1f} | {len(mine)}, {sum(n for b in mine for _, n in b)} | "
              f"{len(theirs)}, {sum(n for b in theirs for _, n in b)} | " + " | ".join(cells) + " |")
    print()
    print(f"their windows together: real {sums['real'] * 1e3:.0f} ms, sim {sums['sim'] * 1e3:.0f} ms "
          f"({sums['sim'] / sums['real'] - 1:+.1%}), "
          + ", ".join(f"{name} on the real content {sums[name] * 1e3:.0f} ms ({sums[name] / sums['real'] - 1:+.1%})"
                      for name in profiles))
    hit = []
    for me in real.filter(pl.col("completion_tokens") > 1).sort("t_first_token").iter_rows(named=True):
        ticks = scrape_ticks(meta, me["server"], me["server_prefill_finished"] - 0.03, me["server_finished"])
        if ticks:
            twin = by_id[me["id"]]
            excess = (me["t_finish"] - me["t_first_token"]) - (twin["t_finish"] - twin["t_first_token"])
            where = ", ".join(f"{(t - me['server_prefill_finished']) * 1e3:+.1f}" for t in ticks)
            hit.append(f"| {me['id']} | {me['completion_tokens']} | {where} | "
                       f"{(me['server_finished'] - me['server_prefill_finished']) * 1e3:.1f} | {excess * 1e3:+.1f} | "
                       f"{me['tpot'] * 1e3:.2f} | {twin['tpot'] * 1e3:.2f} |")
    print()
    if not meta.get("server_metrics"):
        print("the real run scraped no /metrics")
        return
    print(f"/metrics scrape ticks (every {meta['options']['metrics_interval']} s) inside a stream "
          f"(prefill_finished - 30 ms -> finished):")
    print("| id | out | tick - prefill_finished, ms | window real, ms | stream real - sim, ms | TPOT real | sim |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    print("\n".join(hit) if hit else "(none)")
    (gpu,) = {s["accelerator"] for s in meta["servers"]}
    for hold_ms in opts.hold_ms:
        tpots, moved = held_tpots(sim, meta, profile_for_gpu(gpu), hold_ms / 1e3)   # its hops: the GPU's built-in
        real_tpot = real["tpot"].drop_nulls()
        p50, p99 = (tpots.quantile(q, "linear") / real_tpot.quantile(q, "linear") - 1 for q in (0.5, 0.99))
        print(f"replay with {hold_ms:g} ms holds at the scrape ticks: TPOT p50 {p50:+.1%}, p99 {p99:+.1%} of real; "
              f"held: {moved}")


if __name__ == "__main__":
    main()
