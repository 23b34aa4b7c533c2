"""`tracebench generate --workload shared-prompt / multi-turn`: byte-identical files (across processes), the prefix
structure each workload promises, closed-loop fields, and the arguments that do not apply."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from conftest import run_cli, run_cli_process
from tracebench.trace.format import iter_requests, read_header
from tracebench.trace.prefix import reusable_tokens


def _generate(tmp_path: Path, name: str, *args: str, process: bool = False) -> tuple[Path, str]:
    """With `process`, a `python -m tracebench` process of its own (run_cli runs generate in this one): another hash
    seed, nothing of an earlier call in memory."""
    out = tmp_path / name
    proc = (run_cli_process if process else run_cli)("generate", *args, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc.stderr


SHARED = ("--workload", "shared-prompt", "--num-requests", "600", "--groups", "5", "--prefix-len", "200",
          "--block-size", "16", "--input-len", "60", "--output-len", "20", "--group-dist", "zipf",
          "--group-zipf", "1.2")
MULTI = ("--workload", "multi-turn", "--sessions", "40", "--turns", "6", "--input-len", "300", "--output-len", "100",
         "--block-size", "32", "--think-time", "3", "--max-context", "2048")


@pytest.mark.parametrize("args", [SHARED, MULTI, (*MULTI, "--closed-loop", "--think-dist", "uniform")],
                         ids=["shared-prompt", "multi-turn", "closed-loop"])
def test_same_arguments_give_byte_identical_files_and_seeds_differ(tmp_path: Path, args: tuple[str, ...]) -> None:
    first, _ = _generate(tmp_path, "a.jsonl", *args, "--seed", "3")
    second, _ = _generate(tmp_path, "b.jsonl", *args, "--seed", "3", process=True)
    other, _ = _generate(tmp_path, "c.jsonl", *args, "--seed", "4")
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes().split(b"\n", 1)[1] != other.read_bytes().split(b"\n", 1)[1]


def test_shared_prompt_requests_of_a_group_share_its_whole_blocks(tmp_path: Path) -> None:
    trace, stderr = _generate(tmp_path, "shared.jsonl", *SHARED)
    assert "only 192 of the 200 tokens of each system prompt are shared (whole blocks of 16)" in stderr
    header = read_header(trace)
    assert header.block_size == 16
    assert header.fields["workload"] == {"kind": "shared-prompt", "groups": 5, "prefix_len": 200,
                                         "shared_blocks_per_group": 12, "shared_tokens_per_group": 192}
    requests = list(iter_requests(trace))
    by_group: dict[int, list] = defaultdict(list)
    for r in requests:
        by_group[r.extra["group"]].append(r)
        assert r.input_len > 200 and len(r.prefix_blocks) == -(-r.input_len // 16)
    # zipf: group 0 is the most popular, every group is used
    sizes = [len(by_group[g]) for g in range(5)]
    assert sorted(by_group) == [0, 1, 2, 3, 4] and sizes[0] == max(sizes) and sizes[0] > 2 * sizes[4]
    shared = {g: members[0].prefix_blocks[:12] for g, members in by_group.items()}
    assert len(set(shared.values())) == 5  # each group its own prompt
    own_ids = set()
    for g, members in by_group.items():
        for r in members:
            assert r.prefix_blocks[:12] == shared[g]
            own = r.prefix_blocks[12:]  # the rest (incl. the block holding the prompt's last 8 tokens) is its own
            assert own and not own_ids & set(own)
            own_ids.update(own)
    # the ceiling: every request after its group's first reuses the 192 shared tokens
    reusable, total = reusable_tokens([r.prefix_blocks for r in requests], [r.input_len for r in requests], 16)
    assert reusable == 192 * (600 - 5) and total == sum(r.input_len for r in requests)


def test_multi_turn_turn_k_starts_with_all_of_turn_k_minus_1(tmp_path: Path) -> None:
    trace, stderr = _generate(tmp_path, "multi.jsonl", *MULTI)
    header = read_header(trace)
    workload = header.fields["workload"]
    requests = list(iter_requests(trace))
    assert [r.id for r in requests] == list(range(len(requests)))
    sessions: dict[int, list] = defaultdict(list)
    for r in requests:
        sessions[r.extra["session"]].append(r)
        assert r.after is None and r.delay_s is None  # open loop
    assert len(sessions) == 40 and all(len(turns) <= 6 for turns in sessions.values())
    # some sessions outgrow the 2,048-token context and end early: counted in the header and on stderr
    short = sum(len(turns) < 6 for turns in sessions.values())
    assert 0 < short == workload["sessions_cut_short"]
    assert workload["turns_dropped"] == 40 * 6 - len(requests)
    assert f"{short} of 40 sessions ended early" in stderr
    expected_reuse = 0
    for turns in sessions.values():
        assert [r.extra["turn"] for r in turns] == list(range(1, len(turns) + 1))
        for prev, cur in zip(turns, turns[1:]):
            assert cur.arrival_s > prev.arrival_s
            user = cur.input_len - prev.input_len - prev.output_len
            assert user >= 1  # prompt = previous prompt + its answer + new user tokens
            assert cur.prefix_blocks[:len(prev.prefix_blocks)] == prev.prefix_blocks
            expected_reuse += prev.input_len  # the partial last block of turn k-1 is shared too
        assert all(r.input_len + r.output_len <= 2048 and r.input_len <= 2048 - 7 for r in turns)
    ids_of = [set(turns[-1].prefix_blocks) for turns in sessions.values()]
    assert sum(map(len, ids_of)) == len(set().union(*ids_of))  # sessions share no block
    reusable, _ = reusable_tokens([r.prefix_blocks for r in requests], [r.input_len for r in requests], 32)
    assert reusable == expected_reuse


def test_multi_turn_closed_loop_names_the_previous_turn_and_its_think_time(tmp_path: Path) -> None:
    open_trace, _ = _generate(tmp_path, "open.jsonl", *MULTI)
    closed_trace, _ = _generate(tmp_path, "closed.jsonl", *MULTI, "--closed-loop")
    opened, closed = list(iter_requests(open_trace)), list(iter_requests(closed_trace))
    # the same requests in the same order; only the closed-loop fields differ
    assert [(r.arrival_s, r.input_len, r.output_len, r.prefix_blocks) for r in opened] == \
        [(r.arrival_s, r.input_len, r.output_len, r.prefix_blocks) for r in closed]
    by_id = {r.id: r for r in closed}
    for r in closed:
        if r.extra["turn"] == 1:
            assert r.after is None and r.delay_s is None
            continue
        prev = by_id[r.after]
        assert prev.id < r.id and prev.extra == {"session": r.extra["session"], "turn": r.extra["turn"] - 1}
        assert r.delay_s == pytest.approx(r.arrival_s - prev.arrival_s, abs=2e-6)  # arrival_s: the open-loop estimate
    assert read_header(closed_trace).fields["workload"]["closed_loop"] is True


CONTRADICTIONS = {
    "workload_flag_without_workload": (["--groups", "4"], "--groups applies only with --workload"),
    "block_size_without_workload": (["--block-size", "16"], "--block-size applies only with --workload"),
    "workload_with_dataset": (["--workload", "shared-prompt", "--dataset", "{azure}"],
                              "--workload shared-prompt does not apply with --dataset"),
    "multi_turn_flag_on_shared_prompt": (["--workload", "shared-prompt", "--turns", "3"],
                                         "--turns does not apply to --workload shared-prompt"),
    "shared_flag_on_multi_turn": (["--workload", "multi-turn", "--prefix-len", "64"],
                                  "--prefix-len does not apply to --workload multi-turn"),
    "count_on_multi_turn": (["--workload", "multi-turn", "--num-requests", "10"],
                            "--num-requests does not apply to --workload multi-turn"),
    "zipf_exponent_without_zipf": (["--workload", "shared-prompt", "--group-zipf", "1.5"],
                                   "--group-zipf only applies to --group-dist zipf"),
    "zero_groups": (["--workload", "shared-prompt", "--groups", "0"], "--groups must be an integer >= 1"),
    "prefix_shorter_than_a_block": (["--workload", "shared-prompt", "--prefix-len", "40"],
                                    "--prefix-len 40 is shorter than one block (--block-size 64)"),
    "zero_block_size": (["--workload", "multi-turn", "--block-size", "0"], "--block-size must be an integer >= 1"),
    "prefix_over_context": (["--workload", "shared-prompt", "--prefix-len", "4000"],
                            "--prefix-len 4000 + --input-len 512 + --output-len 128 exceed --max-context 4096"),
    "zero_think_time": (["--workload", "multi-turn", "--think-time", "0"], "--think-time must be a number of seconds > 0"),
}


@pytest.mark.parametrize("case", sorted(CONTRADICTIONS))
def test_arguments_that_do_not_apply_are_errors_and_write_nothing(tmp_path: Path, case: str) -> None:
    from conftest import AZURE_CSV

    args, why = CONTRADICTIONS[case]
    proc = run_cli("generate", *[arg.replace("{azure}", str(AZURE_CSV)) for arg in args], cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("tracebench: error: ") and why in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_closed_loop_trace_as_dataset_keeps_after_only_in_order(tmp_path: Path) -> None:
    closed, _ = _generate(tmp_path, "closed.jsonl", *MULTI, "--closed-loop")
    again, _ = _generate(tmp_path, "again.jsonl", "--dataset", str(closed), "--in-order", "--rate", "50")
    original, rerun = list(iter_requests(closed)), list(iter_requests(again))
    assert [(r.after, r.delay_s, r.prefix_blocks) for r in rerun] == \
        [(r.after, r.delay_s, r.prefix_blocks) for r in original]
    assert read_header(again).block_size == 32
    proc = run_cli("generate", "--dataset", str(closed), "-o", str(tmp_path / "sampled.jsonl"))
    assert proc.returncode == 2 and "is closed loop" in proc.stderr
    assert not (tmp_path / "sampled.jsonl").exists()


def test_a_prefix_trace_reimported_with_a_smaller_context_keeps_the_blocks_inside_the_cut_prompt(tmp_path: Path) -> None:
    source, _ = _generate(tmp_path, "multi.jsonl", *MULTI)
    cut, stderr = _generate(tmp_path, "cut.jsonl", "--dataset", str(source), "--keep-timestamps", "--max-context", "1000")
    original, again = list(iter_requests(source)), list(iter_requests(cut))
    assert read_header(cut).block_size == 32
    was_cut = 0
    for before, after in zip(original, again, strict=True):
        assert after.input_len == min(before.input_len, 1000 - 7)
        assert after.prefix_blocks == before.prefix_blocks[: -(-after.input_len // 32)]
        was_cut += after.input_len < before.input_len
    assert was_cut > 0 and f"{was_cut} of them with the prompt cut" in stderr
