"""Every bad input of issue 2, through the CLI (its click entry point, in the pytest process: tests/conftest.py
run_cli): exit code 2, one line naming file, line and field, and no output file left behind. Plus: the columnar
reader's errors are exactly the streaming reader's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import run_cli
from tracebench.errors import TraceError
from tracebench.trace import format as trace_format
from tracebench.trace.format import iter_requests, read_columns

HEADER = '{"tracebench_trace":1,"num_requests":3,"duration_s":2.0}'
GOOD = ['{"id":0,"arrival_s":0.0,"input_len":5,"output_len":3}', '{"id":1,"arrival_s":1.0,"input_len":6,"output_len":2}']

# name -> (file content, line, field or None, words in the reason)
BROKEN_TRACES = {
    "not_json": ("\n".join([HEADER, *GOOD, '{"id":2,"arrival_s":2.0,"input_len":5,']), 4, None, "not JSON"),
    "missing_field": ("\n".join([HEADER, GOOD[0], '{"id":1,"arrival_s":1.0,"input_len":6}', GOOD[1]]), 3,
                      "output_len", "missing"),
    "negative_length": ("\n".join([HEADER, *GOOD, '{"id":2,"arrival_s":2.0,"input_len":-5,"output_len":3}']), 4,
                        "input_len", "must be an integer >= 1, got -5"),
    "non_integer_length": ("\n".join([HEADER, *GOOD, '{"id":2,"arrival_s":2.0,"input_len":5,"output_len":2.5}']), 4,
                           "output_len", "must be an integer >= 1, got 2.5"),
    "arrival_backwards": ("\n".join([HEADER, *GOOD, '{"id":2,"arrival_s":0.5,"input_len":5,"output_len":3}']), 4,
                          "arrival_s", "goes backwards (0.5 after 1.0)"),
    "missing_version": ("\n".join(['{"num_requests":2,"duration_s":1.0}', *GOOD]), 1, "tracebench_trace", "missing"),
    "unknown_version": ("\n".join(['{"tracebench_trace":2,"num_requests":2,"duration_s":1.0}', *GOOD]), 1,
                        "tracebench_trace", "unknown trace format version 2"),
    "count_mismatch": ("\n".join([HEADER, *GOOD]), 1, "num_requests", "header says 3 requests, the file has 2"),
}
# Prefix blocks and closed loop (issue 12): block_size 4, so input_len 5 needs ceil(5/4) = 2 blocks.
BLOCK_HEADER = HEADER.replace("}", ',"block_size":4}')
BLOCKS_OK = '{"id":0,"arrival_s":0.0,"input_len":5,"output_len":3,"prefix_blocks":[1,2]}'


def _blocks_case(header: str, line3: str) -> str:
    return "\n".join([header, BLOCKS_OK, line3, '{"id":2,"arrival_s":2.0,"input_len":4,"output_len":3}'])


BROKEN_TRACES.update({
    "blocks_too_few": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":9,"output_len":2,'
                                                  '"prefix_blocks":[1,2]}'), 3, "prefix_blocks",
                       "has 2 block(s); input_len 9 with block_size 4 needs ceil(9/4) = 3"),
    "blocks_too_many": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,'
                                                   '"prefix_blocks":[1,2]}'), 3, "prefix_blocks", "needs ceil(4/4) = 1"),
    "blocks_empty": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,'
                                                '"prefix_blocks":[]}'), 3, "prefix_blocks", "has 0 block(s)"),
    "blocks_not_a_list": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,'
                                                     '"prefix_blocks":"1"}'), 3, "prefix_blocks",
                          "must be a list of integers"),
    "blocks_null": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,'
                                               '"prefix_blocks":null}'), 3, "prefix_blocks", "must be a list of integers"),
    "block_float": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":8,"output_len":2,'
                                               '"prefix_blocks":[1,2.5]}'), 3, "prefix_blocks",
                    "must be a list of integers"),
    "block_bool": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":8,"output_len":2,'
                                              '"prefix_blocks":[1,true]}'), 3, "prefix_blocks",
                   "must be a list of integers"),
    "block_beyond_64_bits": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,'
                                                        '"prefix_blocks":[9223372036854775808]}'), 3, "prefix_blocks",
                             "must be a list of integers (64-bit)"),
    "block_size_missing": (_blocks_case(HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2}'), 2,
                           "prefix_blocks", "the trace header (line 1) has no block_size"),
    "block_size_zero": (_blocks_case(HEADER.replace("}", ',"block_size":0}'), GOOD[1]), 1, "block_size",
                        "must be an integer >= 1"),
    "block_size_negative": (_blocks_case(HEADER.replace("}", ',"block_size":-512}'), GOOD[1]), 1, "block_size",
                            "must be an integer >= 1"),
    "block_size_not_int": (_blocks_case(HEADER.replace("}", ',"block_size":"512"}'), GOOD[1]), 1, "block_size",
                           "must be an integer >= 1"),
    "after_later_id": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,"after":2,'
                                                  '"delay_s":0.5}'), 3, "after",
                       "names request 2, which is not an earlier line"),
    "after_missing_id": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,'
                                                    '"after":7,"delay_s":0.5}'), 3, "after", "names request 7"),
    "after_itself": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,"after":1,'
                                                '"delay_s":0.5}'), 3, "after", "names request 1"),
    "after_not_int": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,'
                                                 '"after":"0","delay_s":0.5}'), 3, "after", "must be the integer id"),
    "after_without_delay": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,'
                                                       '"after":0}'), 3, "delay_s", "missing"),
    "delay_without_after": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,'
                                                       '"delay_s":0.5}'), 3, "after", "missing"),
    "delay_negative": (_blocks_case(BLOCK_HEADER, '{"id":1,"arrival_s":1.0,"input_len":4,"output_len":2,"after":0,'
                                                  '"delay_s":-1}'), 3, "delay_s", "must be a finite number >= 0"),
})


def _assert_one_line_error(proc, where: str, why: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"tracebench: error: {where}"), lines[0]
    assert why in lines[0], lines[0]
    assert proc.stdout == ""


def _located(path: Path, line: int | None, field: str | None) -> str:
    where = f"{path}" if line is None else f"{path}:{line}"
    return f"{where}: field '{field}': " if field else f"{where}: "


@pytest.mark.parametrize("case", sorted(BROKEN_TRACES))
def test_broken_trace_inspect_and_generate_from_it(tmp_path: Path, case: str) -> None:
    content, line, field, why = BROKEN_TRACES[case]
    trace = tmp_path / f"{case}.jsonl"
    trace.write_text(content + "\n")
    _assert_one_line_error(run_cli("inspect", str(trace)), _located(trace, line, field), why)
    out = tmp_path / "out" / "new.jsonl"
    proc = run_cli("generate", "--dataset", str(trace), "--dataset-format", "tracebench", "--keep-timestamps",
                   "-o", str(out))
    _assert_one_line_error(proc, _located(trace, line, field), why)
    assert not out.exists() and not out.parent.exists()


BROKEN_DATASETS = {
    "azure_header": ("TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n", "azure", 1, None,
                     "expected the Azure header"),
    "azure_negative": ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                       "2023-11-16 18:15:47.0000000,-3,44\n", "azure", 3, "ContextTokens", "must be an integer >= 0"),
    "azure_timestamp": ("TIMESTAMP,ContextTokens,GeneratedTokens\n16/11/2023 18:15,374,44\n", "azure", 2, "TIMESTAMP",
                        "not a date-time"),
    "azure_columns": ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374\n", "azure", 2, None,
                      "expected 3 columns, got 2"),
    "mooncake_not_json": ('{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"timestamp": 5,\n', "mooncake",
                          2, None, "not JSON"),
    "mooncake_missing": ('{"timestamp": 0, "output_length": 2}\n', "mooncake", 1, "input_length", "missing"),
    "mooncake_fraction": ('{"timestamp": 0, "input_length": 10, "output_length": 2.5}\n', "mooncake", 1,
                          "output_length", "must be an integer >= 0, got 2.5"),
    "mooncake_hash_ids": ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": "0,1"}\n', "mooncake",
                          1, "hash_ids", "must be a list of integers"),
    "mooncake_backwards": ('{"timestamp": 900, "input_length": 10, "output_length": 2}\n'
                           '{"timestamp": 100, "input_length": 10, "output_length": 2}\n', "mooncake", 2, "timestamp",
                           "goes backwards"),
    "unknown_format": ("id,prompt\n1,hello\n", "auto", 1, None, "cannot tell the dataset format"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_DATASETS))
def test_broken_dataset_is_a_located_error_and_writes_nothing(tmp_path: Path, case: str) -> None:
    content, fmt, line, field, why = BROKEN_DATASETS[case]
    dataset = tmp_path / f"{case}.data"
    dataset.write_text(content)
    out = tmp_path / "out.jsonl"
    proc = run_cli("generate", "--dataset", str(dataset), "--dataset-format", fmt, "--keep-timestamps", "-o", str(out))
    _assert_one_line_error(proc, _located(dataset, line, field), why)
    assert sorted(p.name for p in tmp_path.iterdir()) == [dataset.name]  # no output, no temporary file


def test_unreadable_dataset(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    missing = tmp_path / "nope.csv"
    _assert_one_line_error(run_cli("generate", "--dataset", str(missing), "-o", str(out)), f"{missing}: ",
                           "cannot read: No such file or directory")
    _assert_one_line_error(run_cli("generate", "--dataset", str(tmp_path), "-o", str(out)), f"{tmp_path}: ",
                           "cannot read: is a directory")
    binary = tmp_path / "blob.csv"
    binary.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff\xfe,1,2\n")
    _assert_one_line_error(run_cli("generate", "--dataset", str(binary), "--keep-timestamps", "-o", str(out)),
                           f"{binary}:2: ", "not UTF-8 text")
    _assert_one_line_error(run_cli("inspect", str(missing)), f"{missing}: ", "cannot read")
    assert not out.exists()


CONTRADICTIONS = {
    "burstiness_without_gamma": (["--burstiness", "2"], "--burstiness only applies to --arrival gamma"),
    "gamma_without_burstiness": (["--arrival", "gamma"], "--arrival gamma needs --burstiness"),
    "count_and_duration": (["--num-requests", "10", "--duration", "5"], "--num-requests and --duration exclude"),
    "keep_timestamps_without_dataset": (["--keep-timestamps"], "--keep-timestamps applies only with --dataset"),
    "in_order_without_dataset": (["--in-order"], "--in-order applies only with --dataset"),
    "time_scale_without_keep_timestamps": (["--dataset", "{azure}", "--time-scale", "2"],
                                           "--time-scale only applies with --keep-timestamps"),
    "rate_with_keep_timestamps": (["--dataset", "{azure}", "--keep-timestamps", "--rate", "3"],
                                  "--rate does not apply with --keep-timestamps"),
    "lengths_with_dataset": (["--dataset", "{azure}", "--input-len", "100"],
                             "--input-len does not apply with --dataset"),
    "spread_with_fixed": (["--length-dist", "fixed", "--length-spread", "0.3"], "does not apply to --length-dist fixed"),
    "mean_over_context": (["--input-len", "4000", "--output-len", "200"], "exceed --max-context 4096"),
    "more_rows_than_dataset": (["--dataset", "{azure}", "--keep-timestamps", "--num-requests", "20000"],
                               "has 19366 usable rows"),
    "zero_rate": (["--rate", "0"], "--rate must be a number > 0"),
}


@pytest.mark.parametrize("case", sorted(CONTRADICTIONS))
def test_contradictory_flags_are_config_errors_and_write_nothing(tmp_path: Path, case: str) -> None:
    from conftest import AZURE_CSV

    args, why = CONTRADICTIONS[case]
    args = [arg.replace("{azure}", str(AZURE_CSV)) for arg in args]
    proc = run_cli("generate", *args, cwd=tmp_path)  # default output path: traces/... under tmp_path
    _assert_one_line_error(proc, "", why)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", sorted(BROKEN_TRACES))
def test_columnar_reader_raises_exactly_what_the_streaming_reader_raises(tmp_path: Path, case: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    content, _, _, _ = BROKEN_TRACES[case]
    trace = tmp_path / "t.jsonl"
    trace.write_text(content + "\n")
    with pytest.raises(TraceError) as streaming:
        list(iter_requests(trace))
    for batch_bytes in (1 << 20, 1):  # one batch; one line per batch (the error in a later batch)
        monkeypatch.setattr(trace_format, "_COLUMN_BATCH_BYTES", batch_bytes)
        with pytest.raises(TraceError) as columnar:
            read_columns(trace)
        assert str(columnar.value) == str(streaming.value)


def test_columnar_reader_matches_streaming_reader_on_valid_traces(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "t.jsonl"
    lines = [
        '{"tracebench_trace":1,"num_requests":4,"duration_s":3,"block_size":2}',
        '{"id":-4,"arrival_s":0,"input_len":3,"output_len":1,"prefix_blocks":[1,2]}',
        '{"output_len":9,"input_len":8,"arrival_s":1.5e-3,"id":7}',
        '{"id":8,"arrival_s":1.5e-3,"input_len":9223372036854775807,"output_len":2}',
        '{"id":20,"arrival_s":3,"input_len":4,"output_len":5}',
    ]
    trace.write_text("\n".join(lines))  # no newline at the end
    monkeypatch.setattr(trace_format, "_COLUMN_BATCH_BYTES", 100)
    _, columns = read_columns(trace)
    streamed = list(iter_requests(trace))
    assert columns.id.tolist() == [r.id for r in streamed]
    assert columns.arrival_s.tolist() == [r.arrival_s for r in streamed]
    assert columns.input_len.tolist() == [r.input_len for r in streamed]
    assert columns.output_len.tolist() == [r.output_len for r in streamed]
    # a true/false length and a 2**63 id are rejected by both readers
    for bad, field in (('{"id":30,"arrival_s":4,"input_len":true,"output_len":1}', "input_len"),
                       ('{"id":9223372036854775808,"arrival_s":4,"input_len":1,"output_len":1}', "id")):
        trace.write_text("\n".join([lines[0].replace('"num_requests":4', '"num_requests":5'), *lines[1:], bad]))
        with pytest.raises(TraceError, match=f":6: field '{field}'") as columnar:
            read_columns(trace)
        with pytest.raises(TraceError) as streaming:
            list(iter_requests(trace))
        assert str(columnar.value) == str(streaming.value)


def test_the_replay_table_gives_the_requests_the_streaming_reader_reads(tmp_path: Path) -> None:
    """TraceTable.request (the replay's per-request read, which fills TraceRequest's slots itself) gives requests
    equal to those iter_requests builds, field by field: prefix blocks, closed-loop `after`/`delay_s` and open-loop
    ones (`extra` is dropped: the replay does not read it)."""
    trace = tmp_path / "multi.jsonl"
    done = run_cli("generate", "--workload", "multi-turn", "--sessions", "6", "--turns", "3", "--think-time", "2",
                   "--closed-loop", "--seed", "4", "-o", str(trace))
    assert done.returncode == 0, done.stderr
    streamed = list(iter_requests(trace))
    table = trace_format.load_trace_table(trace)[1]
    assert len(table) == len(streamed) == 18
    assert any(r.after is not None for r in streamed) and any(r.after is None for r in streamed)
    assert all(r.prefix_blocks for r in streamed)
    for i, want in enumerate(streamed):
        got = table.request(i)
        assert got == dataclasses.replace(want, extra=None) and hash(got) == hash(dataclasses.replace(want, extra=None))
        assert [type(getattr(got, f.name)) for f in dataclasses.fields(got)] == [
            type(getattr(want, f.name)) if f.name != "extra" else type(None) for f in dataclasses.fields(want)]
