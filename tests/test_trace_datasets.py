"""Importers through the CLI: the real Azure LLM inference CSV, a Mooncake JSONL written here, tracebench traces,
auto-detection."""

from __future__ import annotations

import bisect
import csv
import hashlib
import lzma
from datetime import datetime
from pathlib import Path

import orjson
import pytest

from conftest import AZURE_CSV, run_cli
from tracebench.trace.format import iter_requests, read_header



def _azure_rows() -> list[tuple[float, int, int]]:
    """The CSV read independently of tracebench: (seconds since the first row, context, generated)."""
    with lzma.open(AZURE_CSV, "rt", newline="") as fh:
        rows = list(csv.reader(fh))[1:]
    # 7 fractional digits: datetime takes 6; the 7th (100 ns) is below the trace's microsecond resolution
    times = [datetime.strptime(row[0][:26], "%Y-%m-%d %H:%M:%S.%f") for row in rows]
    return [((t - times[0]).total_seconds(), int(row[1]), int(row[2])) for t, row in zip(times, rows)]


def _generate(tmp_path: Path, name: str, *args: str) -> tuple[Path, str]:
    out = tmp_path / name
    proc = run_cli("generate", *args, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc.stderr


def test_azure_keep_timestamps_replays_the_csv_arrivals_and_lengths(tmp_path: Path) -> None:
    rows = _azure_rows()
    assert len(rows) == 19366
    trace, _ = _generate(tmp_path, "azure.jsonl", "--dataset", str(AZURE_CSV), "--keep-timestamps",
                         "--max-context", "20000")
    requests = list(iter_requests(trace))
    assert len(requests) == len(rows)
    assert requests[0].arrival_s == 0.0
    for req, (t, context, generated) in zip(requests, rows):
        assert abs(req.arrival_s - t) < 1.5e-6  # microsecond formatting + the dropped 7th digit
        assert (req.input_len, req.output_len) == (context, generated)
    header = read_header(trace).fields
    assert header["source"] == {
        "path": "tests/data/" + AZURE_CSV.name, "format": "azure", "detected": True,  # relative to the working folder
        "sha256": hashlib.sha256(lzma.decompress(AZURE_CSV.read_bytes())).hexdigest(), "rows": 19366, "dropped_zero_tokens": 0,
        "usable_rows": 19366,
    }
    assert header["clamped_requests"] == 0 and header["duration_s"] == requests[-1].arrival_s


def test_azure_time_scale_cut_and_default_context_clamp(tmp_path: Path) -> None:
    rows = _azure_rows()
    trace, stderr = _generate(tmp_path, "fast.jsonl", "--dataset", str(AZURE_CSV), "--keep-timestamps",
                              "--time-scale", "4", "--num-requests", "5000")
    requests = list(iter_requests(trace))
    assert len(requests) == 5000
    for req, (t, _, _) in zip(requests, rows):
        assert abs(req.arrival_s - t / 4) < 1.5e-6
    header = read_header(trace).fields
    # sglang 0.5.17 generates the whole answer only when input + output <= context - 2 (scheduler.py L2132-2141)
    expected_clamped = sum(1 for _, c, g in rows[:5000] if c + g > 4094 or c > 4089)
    expected_cut = sum(1 for _, c, _ in rows[:5000] if c > 4089)  # sglang 0.5.17 serves at most context - 7
    assert expected_clamped > 0
    assert (header["clamped_requests"], header["clamped_input_requests"]) == (expected_clamped, expected_cut)
    assert (f"{expected_clamped} of 5000 requests clamped to input_len + output_len <= 4094: sglang generates the whole "
            f"answer only up to its context length - 2 (--max-context 4096, the default, llama-2's: give your model's "
            f"with --max-context); {expected_cut} of them with the prompt cut") in stderr
    assert all(r.input_len + r.output_len <= 4094 for r in requests)
    for req, (_, context, generated) in zip(requests, rows):
        if context <= 4089 and context + generated <= 4094:
            assert (req.input_len, req.output_len) == (context, generated)
        elif context <= 4089:
            assert (req.input_len, req.output_len) == (context, 4094 - context)  # the prompt is kept
        else:  # sglang 0.5.17 serves prompts of at most context - 7 tokens, and then at most 5 output tokens
            assert (req.input_len, req.output_len) == (4089, min(generated, 5))


def test_azure_lengths_sampled_or_in_order_with_generated_arrivals(tmp_path: Path) -> None:
    rows = _azure_rows()
    pairs = {(c, g) for _, c, g in rows}
    sampled, _ = _generate(tmp_path, "s.jsonl", "--dataset", str(AZURE_CSV), "--rate", "5", "--max-context", "20000")
    requests = list(iter_requests(sampled))
    assert len(requests) == 1000  # the default count
    assert all((r.input_len, r.output_len) in pairs for r in requests)
    assert len({(r.input_len, r.output_len) for r in requests}) > 900  # sampled, not the first rows repeated
    in_order, _ = _generate(tmp_path, "o.jsonl", "--dataset", str(AZURE_CSV), "--in-order", "--duration", "30",
                            "--max-context", "20000", "--arrival", "constant", "--rate", "10")
    requests = list(iter_requests(in_order))
    assert len(requests) == 300
    assert [(r.input_len, r.output_len) for r in requests] == [(c, g) for _, c, g in rows[:300]]
    assert requests[-1].arrival_s == pytest.approx(29.9)


def _write_mooncake(path: Path) -> list[dict]:
    rows = [
        {"timestamp": 0, "input_length": 1200, "output_length": 40, "hash_ids": [0, 1, 2]},
        {"timestamp": 0, "input_length": 700, "output_length": 12, "hash_ids": [0, 3]},
        {"timestamp": 1500, "input_length": 0, "output_length": 5, "hash_ids": []},  # zero tokens: dropped
        {"timestamp": 3052, "input_length": 5000, "output_length": 300, "hash_ids": list(range(4, 14))},
        {"timestamp": 4000, "input_length": 300, "output_length": 30, "hash_ids": [0], "session": "not carried"},
    ]
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return rows


def test_mooncake_keep_timestamps_carries_prefix_blocks_and_drops_zero_rows(tmp_path: Path) -> None:
    source = tmp_path / "mooncake_trace.jsonl"
    _write_mooncake(source)
    trace, stderr = _generate(tmp_path, "m.jsonl", "--dataset", str(source), "--keep-timestamps",
                              "--max-context", "3000", "--time-scale", "2")
    requests = list(iter_requests(trace))
    assert [(r.arrival_s, r.input_len, r.output_len) for r in requests] == [
        (0.0, 1200, 40), (0.0, 700, 12), (1.526, 2993, 5), (2.0, 300, 30)]  # 2993 + 5 = 3000 - 2
    # prefix blocks carried; the cut prompt (3000 - 7 = 2993 tokens) keeps only its ceil(2993 / 512) = 6 blocks
    assert [r.prefix_blocks for r in requests] == [(0, 1, 2), (0, 3), (4, 5, 6, 7, 8, 9), (0,)]
    assert read_header(trace).block_size == 512
    source_info = read_header(trace).fields["source"]
    assert (source_info["format"], source_info["detected"], source_info["rows"],
            source_info["dropped_zero_tokens"]) == ("mooncake", True, 5, 1)
    assert "1 dropped for zero tokens" in stderr


def test_auto_detection_by_content_and_tracebench_traces_as_datasets(tmp_path: Path) -> None:
    mooncake = tmp_path / "rows.data"  # the name says nothing: detection reads the content
    _write_mooncake(mooncake)
    azure = tmp_path / "azure.data"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.0100000+00:00,10,2\n"
                     "2024-05-10T00:00:01.5+00:00,20,3\n")
    for path, fmt in ((mooncake, "mooncake"), (azure, "azure")):
        auto, _ = _generate(tmp_path, f"auto-{fmt}.jsonl", "--dataset", str(path), "--keep-timestamps")
        explicit, _ = _generate(tmp_path, f"explicit-{fmt}.jsonl", "--dataset", str(path), "--keep-timestamps",
                                "--dataset-format", fmt)
        assert read_header(auto).fields["source"]["format"] == fmt
        assert read_header(auto).fields["source"]["detected"] is True
        assert read_header(explicit).fields["source"]["detected"] is False
        assert [r for r in iter_requests(auto)] == [r for r in iter_requests(explicit)]
    assert [r.arrival_s for r in iter_requests(tmp_path / "auto-azure.jsonl")] == [0.0, 1.49]
    # a tracebench trace re-imported with its own timestamps gives the same requests
    original, _ = _generate(tmp_path, "orig.jsonl", "--num-requests", "200", "--seed", "4")
    again, _ = _generate(tmp_path, "again.jsonl", "--dataset", str(original), "--keep-timestamps")
    assert list(iter_requests(again)) == list(iter_requests(original))
    assert read_header(again).fields["source"]["format"] == "tracebench"


def test_busiest_window_is_the_csvs_densest_minute_and_an_explicit_window_cuts_its_own_time(tmp_path: Path) -> None:
    rows = _azure_rows()
    times = [t for t, _, _ in rows]
    # the busiest 60 s, found here row by row: the row i whose [t_i, t_i + 60) holds the most rows (first on a tie);
    # the rows are in time order, so those are rows i up to the first at t_i + 60 or later (a bisection, not a count
    # over every later row: that took 5 CPU-s of the suite)
    assert times == sorted(times)
    counts = [bisect.bisect_left(times, t + 60, i) - i for i, t in enumerate(times)]
    best = counts.index(max(counts))
    trace, stderr = _generate(tmp_path, "busy.jsonl", "--dataset", str(AZURE_CSV), "--keep-timestamps",
                              "--busiest", "60", "--max-context", "20000")
    requests = list(iter_requests(trace))
    assert len(requests) == max(counts) and requests[0].arrival_s == 0.0
    for req, (t, context, generated) in zip(requests, rows[best:]):
        assert abs(req.arrival_s - (t - times[best])) < 2e-6
        assert (req.input_len, req.output_len) == (context, generated)
    window = read_header(trace).fields["source"]["window"]
    assert window["rows"] == max(counts) and window["busiest_s"] == 60 and abs(window["start_s"] - times[best]) < 2e-6
    assert f"its busiest 60 s: {window['start_s']:.3f} s to" in stderr

    # seconds 840-900 of the dataset's own time: the rows in [840, 900), shifted so that 840 is 0
    cut, _ = _generate(tmp_path, "cut.jsonl", "--dataset", str(AZURE_CSV), "--keep-timestamps",
                       "--window-start", "840", "--window-end", "900", "--max-context", "20000")
    want = [(t - 840, i, o) for t, i, o in rows if 840 <= t < 900]
    got = list(iter_requests(cut))
    assert len(got) == len(want) > 0 and got[0].arrival_s > 0
    assert all(abs(r.arrival_s - t) < 2e-6 and (r.input_len, r.output_len) == (i, o) for r, (t, i, o) in zip(got, want))
    again, _ = _generate(tmp_path, "again.jsonl", "--dataset", str(AZURE_CSV), "--keep-timestamps",
                         "--window-start", "840", "--window-end", "900", "--max-context", "20000")
    assert again.read_bytes() == cut.read_bytes()  # same arguments, same bytes

    # sampled lengths from the window only: every request's lengths are one of the window's rows
    sampled, _ = _generate(tmp_path, "sampled.jsonl", "--dataset", str(AZURE_CSV), "--rate", "5",
                           "--num-requests", "50", "--window-start", "840", "--window-end", "900",
                           "--max-context", "20000")
    assert {(r.input_len, r.output_len) for r in iter_requests(sampled)} <= {(i, o) for _, i, o in want}


@pytest.mark.parametrize("args, message", [
    (["--busiest", "60", "--window-start", "5"], "--window-start does not apply with --busiest"),
    (["--busiest", "5000"], "--busiest 5000 s: the dataset"),
    (["--window-start", "900", "--window-end", "840"], "--window-end 840 must be after --window-start 900"),
    (["--window-end", "1e6"], "leave --window-end out"),
    (["--window-start", "-1"], "--window-start must be a number of seconds >= 0"),
])
def test_bad_windows_are_one_line_errors_and_write_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "t.jsonl"
    proc = run_cli("generate", "--dataset", str(AZURE_CSV), "--keep-timestamps", *args, "-o", str(out))
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()
    proc = run_cli("generate", "--busiest", "60", "-o", str(out))
    assert proc.returncode == 2 and "--busiest applies only with --dataset" in proc.stderr


def test_the_dataset_path_is_recorded_portably(tmp_path: Path) -> None:
    """docs/run-format.md "Paths": inside the working folder relative to it, elsewhere only `…/<name>`; the same
    file named two ways gives the same trace."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "m.jsonl").write_bytes(b'{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                                   b'{"timestamp": 500, "input_length": 20, "output_length": 6}\n')
    relative = run_cli("generate", "--dataset", "data/m.jsonl", "--keep-timestamps", "-o", "a.jsonl", cwd=tmp_path)
    absolute = run_cli("generate", "--dataset", str(data / "m.jsonl"), "--keep-timestamps", "-o", "b.jsonl",
                       cwd=tmp_path)
    assert relative.returncode == absolute.returncode == 0, relative.stderr + absolute.stderr
    header = read_header(tmp_path / "a.jsonl").fields
    assert header["source"]["path"] == header["args"]["dataset"] == "data/m.jsonl"
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    elsewhere = run_cli("generate", "--dataset", str(data / "m.jsonl"), "--keep-timestamps", "-o",
                        str(tmp_path / "c.jsonl"), cwd=data.parent.parent)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert read_header(tmp_path / "c.jsonl").fields["args"]["dataset"] == str(Path(tmp_path.name) / "data/m.jsonl")
