"""bench/split_trace.py and bench/sim_vs_real.py --pool: a round_robin routing run replayed one server at a time
(issue 19 part 3, when one GPU is lent for a two-GPU run)."""

from __future__ import annotations

import hashlib
import lzma
import subprocess
import sys
from pathlib import Path

import orjson
import polars as pl
import pytest

from conftest import REPO
from tracebench.report.load import Run, load_run
from tracebench.trace.format import load_trace

sys.path.insert(0, str(REPO / "bench"))
from sim_vs_real import pooled  # noqa: E402


def write(path: Path, requests: list[dict], **header: object) -> Path:
    head = {"tracebench_trace": 1, "num_requests": len(requests), "duration_s": requests[-1]["arrival_s"],
            "block_size": 4, **header}
    path.write_bytes(b"".join(orjson.dumps(obj) + b"\n" for obj in [head, *requests]))
    return path


def split(trace: Path, parts: int, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "bench" / "split_trace.py"), str(trace), "--parts", str(parts),
                           "--out-dir", str(out)], capture_output=True, text=True)


def test_parts_are_what_round_robin_sends_each_server(tmp_path: Path) -> None:
    requests = [{"id": 10 + i, "arrival_s": 0.25 * i, "input_len": 8, "output_len": 3 + i,
                 **({"prefix_blocks": [i % 2, 7]} if i % 3 else {})} for i in range(7)]
    trace = write(tmp_path / "t.jsonl", requests, rate=4)
    done = split(trace, 3, tmp_path / "parts")
    assert done.returncode == 0, done.stderr
    source_lines = trace.read_bytes().splitlines()[1:]
    for part in range(3):
        path = tmp_path / "parts" / f"t.part{part}of3.jsonl"
        assert done.stdout.splitlines()[part] == str(path)
        header, reqs = load_trace(path)          # a valid trace
        assert [r.id for r in reqs] == [10 + i for i in range(part, 7, 3)]
        assert path.read_bytes().splitlines()[1:] == source_lines[part::3]   # request lines byte for byte
        assert header.num_requests == len(reqs) and header.duration_s == reqs[-1].arrival_s
        assert header.block_size == 4 and header.fields["rate"] == 4
        assert header.fields["split"]["part"] == part and header.fields["split"]["parts"] == 3
    # the examples keep traces xz-compressed: the same parts, byte for byte (their sha256 is what the runs replayed)
    packed = tmp_path / "t.jsonl.xz"
    packed.write_bytes(lzma.compress(trace.read_bytes()))
    assert split(packed, 3, tmp_path / "from-xz").returncode == 0
    for part in range(3):
        name = f"t.part{part}of3.jsonl"
        assert (tmp_path / "from-xz" / name).read_bytes() == (tmp_path / "parts" / name).read_bytes()


def test_a_closed_loop_trace_is_refused(tmp_path: Path) -> None:
    requests = [{"id": 0, "arrival_s": 0.0, "input_len": 5, "output_len": 3},
                {"id": 1, "arrival_s": 0.0, "input_len": 5, "output_len": 3, "after": 0, "delay_s": 1.0}]
    done = split(write(tmp_path / "c.jsonl", requests), 2, tmp_path / "parts")
    assert done.returncode != 0 and "c.jsonl:3: after: a closed-loop trace cannot be split" in done.stderr
    assert not (tmp_path / "parts").exists()


def fake_run(name: str, split_of: dict | None, t_arrival: list[float], t_finish: list[float]) -> Run:
    """A Run as the report's loader gives it, holding only what pooled() reads."""
    n = len(t_arrival)
    requests = pl.DataFrame({"id": list(range(n)), "status": ["ok"] * n, "t_arrival": t_arrival,
                             "t_released": t_arrival, "t_dispatch": t_arrival,
                             "t_first_token": [a + 0.1 for a in t_arrival], "t_finish": t_finish,
                             "completion_tokens": [4] * n, "output_len": [4] * n})
    meta = {"run_name": name, "speed": None, "servers": [{"accelerator": "GPU"}],
            "trace": {"sha256": name, "header": {"split": split_of} if split_of else {}}}
    return Run(label=name, path=Path(name), meta=meta, requests=requests)


def test_pool_joins_the_parts_of_one_split_and_refuses_anything_else() -> None:
    part = {"source_sha256": "abc", "parts": 2, "rule": "i mod 2"}
    a = fake_run("a", {**part, "part": 0}, [0.0, 2.0], [1.0, 3.0])
    b = fake_run("b", {**part, "part": 1}, [1.0, 3.0], [2.0, 5.0])
    both = pooled([a, b], "ab")
    assert both.requests.height == 4 and len(both.meta["servers"]) == 2 and both.trace_sha256 == "abc"
    assert sorted(both.requests["t_arrival"].to_list()) == [0.0, 1.0, 2.0, 3.0]   # one timeline: the trace's
    with pytest.raises(SystemExit, match="not the parts of one split trace"):
        pooled([a], "a")                                                        # part 1 missing
    with pytest.raises(SystemExit, match="not the parts of one split trace"):
        pooled([a, fake_run("c", None, [1.0], [2.0])], "ac")                  # not a part
    with pytest.raises(SystemExit, match="not the parts of one split trace"):
        pooled([a, fake_run("d", {**part, "source_sha256": "zzz", "part": 1}, [1.0], [2.0])], "ad")


def test_the_parts_are_what_the_real_two_gpu_run_sent_each_server(tmp_path: Path) -> None:
    """The premise of a split run, on real sglang: the H100 example's two-GPU round_robin run (1,000 requests, no cap)
    replayed its committed trace, and each server got exactly the requests split_trace.py puts in that server's part,
    whatever the servers did."""
    example = REPO / "reports" / "examples" / "h100-sim-vs-real" / "routing-long-1000"
    trace = example / "mooncake-routing-long.jsonl.xz"
    run = load_run(example / "routing-long-round_robin")
    assert run.trace_sha256 == hashlib.sha256(lzma.decompress(trace.read_bytes())).hexdigest()
    assert run.meta["policy"]["name"] == "round_robin" and run.meta["caps"]["initial"] == [None, None]
    assert split(trace, 2, tmp_path).returncode == 0
    sent = run.requests.group_by("server").agg(pl.col("id").sort()).sort("server")
    for part, ids in zip(range(2), sent["id"].to_list(), strict=True):
        _, made = load_trace(tmp_path / f"mooncake-routing-long.part{part}of2.jsonl")
        assert sorted(req.id for req in made) == ids
        assert len(ids) == 500
