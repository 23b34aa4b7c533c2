"""Issue 19 part 2: the client's own time, found (each record's breakdown stamps, the report's "Where the time went")
and cut (the replay loop's timers, the stream reader). docs/overhead.md. Speed targets are checked by
bench/bench_replay.py and bench/gpu/overhead.sh, not here: these tests check what can fail whatever the machine's
load (stamps present, in order, converted right, shown in every format; the stream read right however it is cut)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from aiohttp import web

from conftest import free_port, run_cli, sim_servers
from tracebench.replay.client import CHUNK, FIRST_TOKEN, Answer, SglangClient
from tracebench.precise_loop import run as run_loop
from tracebench.replay.records import RequestRecord
from tracebench.report.breakdown import ALL_STAGES, CAP, OURS, SGLANG, STATIC, breakdown_stats
from tracebench.report.load import request_schema
from tracebench.report.speed import to_simulated_times
from tracebench.trace.format import format_request_line, write_trace

BREAKDOWN = ("t_assigned", "t_built", "t_written", "t_headers", "t_last_chunk", "t_parsed", "server_dispatched",
             "server_first_sent")
LATER = ("slot_wait_s", "batch_wait_s")  # fields added after the breakdown's stamps, at the end
APIS = [(api, stream) for api in ("generate", "completions", "chat") for stream in (True, False)]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with sim_servers(tmp_path_factory.mktemp("overhead-sim")) as start:
        yield start("--speed", "10").url


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, sim: str) -> Path:
    """One run folder per (API, streamed or not), of one small trace, against one sim-server."""
    out = tmp_path_factory.mktemp("overhead-runs")
    trace = out / "t.jsonl"
    done = run_cli("generate", "--rate", "40", "--num-requests", "8", "--input-len", "300", "--output-len", "6",
                   "--length-dist", "fixed", "--seed", "3", "-o", str(trace))
    assert done.returncode == 0, done.stderr
    for api, stream in APIS:
        done = run_cli("replay", str(trace), "--attach", sim, "--api", api, "--stream" if stream else "--no-stream",
                       "--run-name", f"{api}-{stream}", "--out-dir", str(out), "--quiet")
        assert done.returncode == 0, done.stderr
    return out


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("api, stream", APIS)
def test_breakdown_stamps_are_recorded_in_order(runs: Path, api: str, stream: bool) -> None:
    records = _records(runs / f"{api}-{stream}")
    assert len(records) == 8 and {r["status"] for r in records} == {"ok"}
    # the new fields come last, after every field a run recorded before them had
    fields = list(RequestRecord.__dataclass_fields__)
    assert list(records[0]) == fields and fields[-len(BREAKDOWN) - len(LATER):] == [*BREAKDOWN, *LATER]
    for r in records:
        for name in ("t_assigned", "t_built", "t_written", "t_headers", "t_last_chunk", "t_parsed"):
            assert r[name] is not None, (name, r)
        assert (r["t_first_token"] is not None) == stream
        # sglang's meta_info stamps come with /generate only (OpenAI answers carry usage, no meta_info)
        assert (r["server_dispatched"] is not None) == (api == "generate")
        assert (r["server_first_sent"] is not None) == (api == "generate")
        order = ["t_arrival", "t_released", "t_admitted", "t_assigned", "t_built", "t_dispatch", "t_written",
                 "t_headers", *(["t_first_token"] if stream else []), "t_last_chunk", "t_finish", "t_parsed"]
        stamps = [r[name] for name in order]
        assert stamps == sorted(stamps), dict(zip(order, stamps))
        if not stream:
            assert r["t_last_chunk"] == r["t_finish"]  # the whole body is the one chunk
        if api == "generate":
            assert r["server_received"] <= r["server_dispatched"] <= r["server_forward_entry"]
            assert r["server_prefill_finished"] <= r["server_first_sent"]  # sent once the prefill is done
        # no cap: a slot was always free, the slot-wait clock never ran (0, not null: null is never assigned)
        assert r["slot_wait_s"] == 0.0
        # continuous: sent when assigned, no batch to wait for (0, not null: null is never sent)
        assert r["batch_wait_s"] == 0.0


FORMATS = {"table": None, "md": "r.md", "csv": "r.csv", "json": "r.json", "html": "r.html"}


def test_the_report_shows_the_breakdown_in_every_format(runs: Path, tmp_path: Path) -> None:
    stream, plain = runs / "generate-True", runs / "completions-False"
    records = _records(stream)
    texts = {}
    for fmt, name in FORMATS.items():
        args = ["report", str(stream), str(plain), "--format", fmt] + (["-o", str(tmp_path / name)] if name else [])
        done = run_cli(*args)
        assert done.returncode == 0, done.stderr
        texts[fmt] = done.stdout if name is None else (tmp_path / name).read_text()
    for fmt in ("table", "md", "html"):
        text = texts[fmt]
        assert "Where the time went" in text and "whose" in text
        for label in ("release lag", "request written", "sglang HTTP intake", "prefill", "tracebench before the wire"):
            # the terminal table may wrap a long label at a space (COLUMNS=120): its first words start the cell
            assert (label if fmt != "table" else label.rsplit(" ", 1)[0]) in text, (fmt, label)
    doc = json.loads(texts["json"])
    stages = doc["breakdown_stages"]
    assert stages["intake"] == {**stages["intake"], "from": "t_written", "to": "server_received", "whose": SGLANG}
    assert stages["send"]["whose"] == OURS and set(stages) == {s.key for s in ALL_STAGES}
    assert stages["slot_wait"]["part"] == {"how": "in", "field": "slot_wait_s"} and stages["slot_wait"]["whose"] == CAP
    assert stages["assign"]["part"] == {"how": "less", "field": "slot_wait_s"} and stages["send"]["part"] is None
    assert stages["batch_wait"]["part"] == {"how": "in", "field": "batch_wait_s"} and stages["batch_wait"]["whose"] == STATIC
    assert stages["build"]["part"] == {"how": "less", "field": "batch_wait_s"} and stages["build"]["whose"] == OURS
    mine = doc["runs"][0]["breakdown"]
    # no cap, continuous: no run waited for a slot or a batch, so those stages are not shown (their rows); "router and
    # policy" and "request body" are their whole spans
    assert "slot_wait" not in mine and "| wait for a free slot |" not in texts["md"]
    assert "batch_wait" not in mine and "| wait for the batch to fill |" not in texts["md"]
    span = np.array([r["t_assigned"] - r["t_admitted"] for r in records])
    assert mine["assign"]["mean"] == pytest.approx(float(span.mean()))
    body = np.array([r["t_built"] - r["t_assigned"] for r in records])
    assert mine["build"]["mean"] == pytest.approx(float(body.mean()))
    send = np.array([r["t_written"] - r["t_built"] for r in records])
    assert mine["send"]["p50"] == pytest.approx(float(np.percentile(send, 50)))
    assert mine["send"]["p99"] == pytest.approx(float(np.percentile(send, 99)))
    intake = np.array([r["server_received"] - r["t_written"] for r in records])
    assert mine["intake"]["mean"] == pytest.approx(float(intake.mean()))
    # the OpenAI run has no sglang stamps: its server-side stages are empty, its own steps are not
    other = doc["runs"][1]["breakdown"]
    assert other["intake"]["p50"] is None and other["server_seen"]["p50"] is not None and other["send"]["p50"] is not None
    csv = texts["csv"].splitlines()
    assert any(line.startswith("generate-True,breakdown.intake,p50,") for line in csv), csv[:5]
    assert "generate-True,breakdown.intake,whose,sglang," in csv and "generate-True,breakdown.send,whose,tracebench," in csv
    done = run_cli("report", str(stream), "--format", "perfetto", "-o", str(tmp_path / "r.json.trace"))
    assert done.returncode == 0, done.stderr
    parts = {e["name"] for e in json.loads((tmp_path / "r.json.trace").read_text())["traceEvents"] if e.get("cat") == "part"}
    assert {"release lag", "router", "request written", "sglang HTTP intake", "prefill"} <= parts


def _check_wait_in_report(run: Path, records: list[dict], own: list[float], wait: str, rest: str, start: str,
                          end: str, md_row: str) -> float:
    """The report (JSON) on `run` against its records: the stage `wait` (record field `<wait>_s`) and the stage `rest`
    add up to start -> end in the mean, tracebench's own time before the wire is `own`'s mean and small beside the
    wait, and the Markdown table has the stage with its owner (`md_row`). Returns the wait's mean (s)."""
    done = run_cli("report", str(run), "--format", "json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)["runs"][0]["breakdown"]
    waits = np.array([r[f"{wait}_s"] for r in records])
    spans = np.array([r[end] - r[start] for r in records])
    assert got[wait]["mean"] == pytest.approx(float(waits.mean()))
    assert got[wait]["mean"] + got[rest]["mean"] == pytest.approx(float(spans.mean()))
    assert got["own_before"]["mean"] == pytest.approx(float(np.mean(own)))
    assert got["own_before"]["mean"] < got[wait]["mean"] / 4
    done = run_cli("report", str(run), "--format", "md")
    assert done.returncode == 0, done.stderr
    assert md_row in done.stdout
    return got[wait]["mean"]


def test_a_capped_run_counts_the_wait_for_a_slot_as_the_cap_s(sim: str, tmp_path: Path) -> None:
    """Cap 1, four requests arriving at once, ~50 ms each on the simulator: three wait in the router queue for the
    slot. That wait is the cap's (slot_wait_s, the stage "wait for a free slot"), not tracebench's: per record the
    two parts add up to t_assigned - t_admitted, the slot wait covers every spell the slot was held by a request
    assigned before it and the moments between them, and "tracebench before the wire" stays small."""
    trace = write_trace(tmp_path / "t.jsonl", {"num_requests": 4, "duration_s": 0.0},
                        [format_request_line(i, 0.0, 300, 100) for i in range(4)])
    done = run_cli("replay", str(trace), "--attach", sim, "--max-running-requests", "1", "--run-name", "cap",
                   "--out-dir", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    records = sorted(_records(tmp_path / "cap"), key=lambda r: r["t_assigned"])
    assert [r["status"] for r in records] == ["ok"] * 4
    assert records[0]["slot_wait_s"] == 0.0  # the slot was free when it came
    own = []
    for j, r in enumerate(records):
        span = r["t_assigned"] - r["t_admitted"]
        router = span - r["slot_wait_s"]  # the router's and the policy's part (policy_s holds the policy's calls)
        assert 0.0 <= r["slot_wait_s"] <= span and 0.0 <= router, r
        assert 0.0 <= r["policy_s"] < r["t_finish"] - r["t_released"], r
        # no slot was free from each earlier request's assignment (it took the slot) until its record was complete
        # (its slot frees after that): all of that, after this one's admission, is this one's slot wait
        held = sum(q["t_parsed"] - q["t_assigned"] for q in records[:j] if q["t_assigned"] >= r["t_admitted"])
        assert r["slot_wait_s"] >= held and (j == 0 or held > 0.02), (j, r, held)
        assert router < max(0.05, r["slot_wait_s"] / 4), (j, r)  # the loop's hops and the policy: ms, not the wait
        if j > 0:
            # the router's part is its own assignment only, after the slot it took freed (once the request before it
            # finished): not the moments when earlier slots freed and went to the requests ahead of it (the first
            # version counted those too: on real sglang, ~20 of them made 6 ms of "router and policy" per request)
            assert router <= r["t_assigned"] - records[j - 1]["t_finish"], (j, r)
        own.append(r["t_written"] - r["t_arrival"] - (r["t_admitted"] - r["t_released"]) - r["slot_wait_s"])
    wait = _check_wait_in_report(tmp_path / "cap", records, own, "slot_wait", "assign", "t_admitted", "t_assigned",
                                 f"| wait for a free slot | {CAP} |")
    assert wait > 0.03


def test_a_static_run_counts_the_wait_for_its_batch_as_the_mode_s(sim: str, tmp_path: Path) -> None:
    """--mode static --batch-size 3, six requests 0.1 s apart: a batch's members wait ~0.2, ~0.1 and ~0 s for it to
    go. That wait is static batching's (batch_wait_s), not tracebench's: one send moment per batch, the body stays
    small, the report's parts add up, and "tracebench before the wire" stays small."""
    gap = 0.1
    trace = write_trace(tmp_path / "t.jsonl", {"num_requests": 6, "duration_s": 5 * gap},
                        [format_request_line(i, i * gap, 300, 6) for i in range(6)])
    done = run_cli("replay", str(trace), "--attach", sim, "--mode", "static", "--batch-size", "3", "--run-name", "st",
                   "--out-dir", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    records = sorted(_records(tmp_path / "st"), key=lambda r: r["id"])
    assert [r["status"] for r in records] == ["ok"] * 6 and [r["batch"] for r in records] == [0, 0, 0, 1, 1, 1]
    own = []
    for number in (0, 1):
        members = records[3 * number:3 * number + 3]  # one server: in arrival order
        sent = [r["t_assigned"] + r["batch_wait_s"] for r in members]
        assert max(sent) - min(sent) < 1e-9, members  # one moment for the whole batch
        # sent when its last member came (released at or after its arrival), before any member's body was made
        assert members[2]["t_arrival"] <= sent[0] <= min(r["t_built"] for r in members), members
        for j, r in enumerate(members):
            body = r["t_built"] - r["t_assigned"] - r["batch_wait_s"]  # what "request body" holds now
            assert 0.0 <= body < 0.05 and 0.0 <= r["batch_wait_s"] <= r["t_built"] - r["t_assigned"], r
            # the early members waited for the later arrivals: at least until the last one's, less their own delay
            assert r["batch_wait_s"] >= (2 - j) * gap - (r["t_assigned"] - r["t_arrival"]) - 1e-9, (j, r)
            own.append(r["t_written"] - r["t_arrival"] - (r["t_admitted"] - r["t_released"]) - r["slot_wait_s"]
                       - r["batch_wait_s"])
        assert members[0]["batch_wait_s"] > gap and members[2]["batch_wait_s"] < 0.005, members  # large, then ~0
    wait = _check_wait_in_report(tmp_path / "st", records, own, "batch_wait", "build", "t_assigned", "t_built",
                                 f"| wait for the batch to fill | {STATIC} |")
    assert wait > gap / 2


def test_a_sped_up_run_keeps_host_stages_as_measured(tmp_path: Path) -> None:
    """At --speed K the report multiplies the simulator's own time by K, never tracebench's: the breakdown's host
    stages read as measured, its sglang stages K times the run clock's. Capped: the router's own part of the router
    wait reads as measured, the wait for a slot is the rest of the converted span (at least the run clock's)."""
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--rate", "20", "--num-requests", "8", "--input-len", "500", "--output-len", "4",
                   "-o", str(trace)).returncode == 0
    done = run_cli("replay", str(trace), "--backend", "sim", "--speed", "4", "--port-base", str(free_port()),
                   "--max-running-requests", "1", "--run-name", "k4", "--out-dir", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    records = _records(tmp_path / "k4")
    done = run_cli("report", str(tmp_path / "k4"), "--format", "json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)["runs"][0]["breakdown"]
    for key, start, end, k in (("send", "t_built", "t_written", 1), ("record", "t_finish", "t_parsed", 1),
                               ("prefill", "server_forward_entry", "server_prefill_finished", 4),
                               ("to_scheduler", "server_received", "server_dispatched", 4)):
        values = np.array([r[end] - r[start] for r in records]) * k
        assert got[key]["mean"] == pytest.approx(float(values.mean()), rel=1e-6, abs=1e-9), key
    router = np.array([r["t_assigned"] - r["t_admitted"] - r["slot_wait_s"] for r in records])
    assert got["assign"]["mean"] == pytest.approx(float(router.mean()), rel=1e-6, abs=1e-9)
    assert got["slot_wait"]["mean"] >= float(np.mean([r["slot_wait_s"] for r in records])) - 1e-9


def test_a_sped_up_static_run_scales_both_waits_and_keeps_the_host_steps() -> None:
    """report/speed.py on two synthetic records of a static run at K=4 (a batch's first member, which waited for a
    slot, then for its batch; its last): the body and the router's part stay host time, the two waits share the rest
    of the converted span admitted -> batch sent as measured (each >= K x its run-clock value), own time as measured."""
    k = 4.0
    stamps = ("t_arrival", "t_released", "t_admitted", "t_assigned", "t_built", "t_dispatch", "t_written",
              "server_received", "server_dispatched", "server_forward_entry", "server_prefill_finished",
              "server_first_sent", "t_first_token", "server_finished", "t_last_chunk", "t_finish", "t_parsed")
    first = dict(zip(stamps, (1.0, 1.001, 1.001, 1.3015, 1.4017, 1.4017, 1.4025, 1.403, 1.4031, 1.404, 1.41, 1.4105,
                              1.411, 1.42, 1.4205, 1.4206, 1.4207)), slot_wait_s=0.3, batch_wait_s=0.1)
    last = dict(zip(stamps, (1.4, 1.4005, 1.4005, 1.401, 1.4019, 1.4019, 1.4027, 1.403, 1.4031, 1.404, 1.41, 1.4105,
                             1.411, 1.42, 1.4206, 1.4207, 1.4208)), slot_wait_s=0.0, batch_wait_s=0.0005)
    rows = [{**r, "id": i, "input_len": 300, "output_len": 6, "server": 0, "status": "ok", "completion_tokens": 6,
             "prompt_tokens": 300} for i, r in enumerate((first, last))]
    meta = {"mode": "static", "caps": {"initial": [None], "changes": []}, "max_concurrency": None,
            "servers": [{"server_info": {"tracebench_sim": {"output_s": 0.002}}}]}
    raw = pl.DataFrame(rows, schema=request_schema())
    sim, _ = to_simulated_times(raw, meta, k)
    for r, s in zip(raw.to_dicts(), sim.to_dicts()):
        sent = r["t_assigned"] + r["batch_wait_s"]  # the batch went, on the run clock
        assert s["t_dispatch"] == pytest.approx(k * r["t_dispatch"])
        assert s["t_built"] - s["t_assigned"] - s["batch_wait_s"] == pytest.approx(r["t_built"] - sent)  # body: host
        assert s["t_assigned"] - s["t_admitted"] - s["slot_wait_s"] == pytest.approx(
            r["t_assigned"] - r["t_admitted"] - r["slot_wait_s"])  # the router's part: host time as measured
        assert s["batch_wait_s"] >= k * r["batch_wait_s"] and s["slot_wait_s"] >= k * r["slot_wait_s"], (r, s)
        assert s["batch_wait_s"] * r["slot_wait_s"] == pytest.approx(s["slot_wait_s"] * r["batch_wait_s"])  # shared
        assert s["t_admitted"] <= s["t_assigned"] <= s["t_built"], s
    own = [r["t_written"] - r["t_arrival"] - r["slot_wait_s"] - r["batch_wait_s"] for r in rows]
    assert breakdown_stats(sim)["own_before"].mean == pytest.approx(float(np.mean(own)))


# ---- the stream reader: events however the bytes are cut -----------------------------------------------------------

def _events(n: int, crlf: bool) -> bytes:
    out, ids = [], []
    for i in range(n):
        ids.append(1000 + i)
        meta = {"completion_tokens": i + 1, "prompt_tokens": 3, "cached_tokens": 0, "e2e_latency": 0.01,
                "finish_reason": {"type": "length", "length": n} if i == n - 1 else None}
        out.append(b": keepalive\n\n")  # a comment event: ignored
        out.append(b"data: " + json.dumps({"output_ids": ids, "meta_info": meta}).encode() + b"\n\n")
    out.append(b"event: message\nid: 9\ndata: [DONE]\n\n")
    body = b"".join(out)
    return body.replace(b"\n", b"\r\n") if crlf else body


@pytest.mark.parametrize("crlf", [False, True])
def test_the_stream_is_read_whole_however_it_is_cut(crlf: bool) -> None:
    """The server writes the stream in pieces cut at every few bytes (events split anywhere, CR and LF apart):
    the client yields the first token once, one CHUNK per later event, then the final answer from the last event."""
    body = _events(5, crlf)

    async def main() -> list:
        async def handler(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for k in range(0, len(body), 7):  # 7-byte pieces, each flushed on its own
                await resp.write(body[k:k + 7])
                await asyncio.sleep(0)
            return resp

        app = web.Application()
        app.router.add_post("/generate", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock)
        await site.start()
        client = SglangClient(None, True)
        rec = RequestRecord(0, 3, 5, 0.0)
        try:
            items = [item async for item in client.generate(f"http://127.0.0.1:{sock.getsockname()[1]}/generate",
                                                           b"{}", rec, time.monotonic)]
        finally:
            await client.close()
            await runner.cleanup()
        assert rec.t_written is not None and rec.t_headers is not None and rec.t_written <= rec.t_headers
        return items

    items = run_loop(main())
    assert items[:5] == [FIRST_TOKEN, CHUNK, CHUNK, CHUNK, CHUNK]
    answer = items[5]
    assert isinstance(answer, Answer) and answer.status == "ok" and len(items) == 6
    assert answer.meta is not None and answer.meta["completion_tokens"] == 5


def test_the_replay_loop_keeps_asyncio_semantics() -> None:
    """The precise loop is asyncio's own with another wait: timers fire in order and not early, I/O wakes a wait
    before its timeout, the coroutine's value is returned."""
    async def main() -> tuple[list[str], float, bool]:
        loop = asyncio.get_running_loop()
        order: list[str] = []
        t0 = loop.time()
        for delay, name in ((0.004, "b"), (0.0023, "a"), (0.006, "c")):
            loop.call_later(delay, order.append, name)
        await asyncio.sleep(0.0023)
        slept = loop.time() - t0
        await asyncio.sleep(0.006)
        a, b = socket.socketpair()
        ready = loop.create_future()
        loop.add_reader(a.fileno(), lambda: ready.done() or ready.set_result(True))
        t1 = time.monotonic()
        loop.call_soon(b.send, b"x")
        woke = await asyncio.wait_for(ready, timeout=5)
        loop.remove_reader(a.fileno())
        a.close()
        b.close()
        return order, slept, woke and time.monotonic() - t1 < 4

    order, slept, woke = run_loop(main())
    assert order == ["a", "b", "c"] and slept >= 0.0023 and woke
