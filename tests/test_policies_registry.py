"""Finding policies by `--policy` spec: built-in names, path/to/file.py:ClassName, policies/NAME, and every way
that can go wrong (each a PolicyError or ConfigError naming the file)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tracebench.errors import ConfigError, PolicyError
from tracebench.paths import portable_path
from tracebench.policies import Policy, QueuedRequest, ServerView
from tracebench.policies.registry import builtin_policies, load_policy

REPO = Path(__file__).resolve().parents[1]

GOOD = """
from tracebench.policies import Policy

class FirstFree(Policy):
    name = "first_free"
    description = "each request to the first server with a free slot"

    def assign(self, queue, servers):
        free = {s.index: s.free_slots for s in servers}
        picks = []
        for req in queue:
            open_ = [s for s in servers if free[s.index] > 0]
            if not open_:
                break
            picks.append((req, open_[0]))
            free[open_[0].index] -= 1
        return picks
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def load(spec: str, policies_dir: Path, **options: str) -> Policy:
    return load_policy(spec, np.random.default_rng(0), options, policies_dir=policies_dir)


def test_builtin_names(tmp_path: Path) -> None:
    names = list(builtin_policies())
    assert names == ["random", "round_robin", "least_outstanding", "sjf", "power_of_two", "param_aware", "cache_aware", "prefix_hash"]
    for name in names:
        policy = load(name, tmp_path / "policies")
        assert type(policy) is builtin_policies()[name] and policy.name == name


def test_file_and_class(tmp_path: Path) -> None:
    path = write(tmp_path / "mine" / "first.py", GOOD)
    sys_path_before = list(sys.path)
    policy = load(f"{path}:FirstFree", tmp_path / "policies")
    assert policy.name == "first_free" and type(policy).__name__ == "FirstFree"
    assert sys.path == sys_path_before
    described = policy.describe()
    # the working folder's relative path, or `…/first.py` outside it: no absolute path (tracebench/paths.py)
    assert described["file"] == portable_path(path) and not Path(described["file"]).is_absolute()
    assert len(described["file_sha256"]) == 64
    server = ServerView(0, "u", True, 0, 2, 0.0, None, None, None, None)
    picks = policy.assign([QueuedRequest(1, 1, 1, 0.0, 0.0)], [server])
    assert [(r.id, s.index) for r, s in picks] == [(1, 0)]


def test_file_without_class_holding_one_policy(tmp_path: Path) -> None:
    path = write(tmp_path / "first.py", GOOD)
    assert load(str(path), tmp_path / "policies").name == "first_free"


def test_policies_dir_by_name(tmp_path: Path) -> None:
    write(tmp_path / "policies" / "first.py", GOOD)
    assert load("first", tmp_path / "policies").name == "first_free"


def test_shipped_example_loads_both_ways() -> None:
    by_path = load(str(REPO / "policies" / "example_least_loaded.py") + ":LeastLoaded", REPO / "policies")
    by_name = load("example_least_loaded", REPO / "policies", waiting_weight="2")
    assert by_path.name == by_name.name == "least_loaded"
    assert by_name.describe()["settings"] == {"waiting_weight": 2.0}


def test_same_stem_in_two_folders_does_not_collide(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "p.py", GOOD)
    b = write(tmp_path / "b" / "p.py", GOOD.replace('"first_free"', '"other"'))
    assert load(f"{a}:FirstFree", tmp_path).name == "first_free"
    assert load(f"{b}:FirstFree", tmp_path).name == "other"


def test_a_subclass_of_a_builtin_is_the_only_class_counted(tmp_path: Path) -> None:
    write(tmp_path / "policies" / "sub.py", """
        from tracebench.policies.least_outstanding import LeastOutstandingPolicy

        class Mine(LeastOutstandingPolicy):
            name = "mine"
    """)
    assert load("sub", tmp_path / "policies").name == "mine"


def test_a_subclass_of_a_builtin_reads_age_and_observed_unless_it_says_not(tmp_path: Path) -> None:
    # the built-in's False is a promise about its own code: a subclass may read `age` in its own assign
    write(tmp_path / "policies" / "sub.py", """
        from tracebench.policies.round_robin import RoundRobinPolicy

        class Mine(RoundRobinPolicy):
            name = "mine"
    """)
    write(tmp_path / "policies" / "says.py", """
        from tracebench.policies.round_robin import RoundRobinPolicy

        class Says(RoundRobinPolicy):
            name = "says"
            reads_report_age = False
    """)
    mine, says = load("sub", tmp_path / "policies"), load("says", tmp_path / "policies")
    assert (mine.reads_report_age, mine.reads_observed) == (True, True)
    assert (says.reads_report_age, says.reads_observed) == (False, True)
    assert not any(p.reads_report_age for p in builtin_policies().values())


@pytest.mark.parametrize("spec, files, match", [
    ("nope", {}, r"unknown policy 'nope': not a built-in \(random, .*\), and no .*policies/nope.py"),
    ("{d}/missing.py:X", {}, r"missing.py: policy file not found"),
    ("{d}/p.py:", {"p.py": GOOD}, r"missing the class name after ':'"),
    ("{d}/p.py:Other", {"p.py": GOOD}, r"p.py: no class 'Other' \(Policy subclasses there: FirstFree\)"),
    ("{d}/p.py:np", {"p.py": "import numpy as np\n" + GOOD}, r"p.py: np is not a subclass of tracebench.policies.Policy"),
    ("{d}/p.py:Policy", {"p.py": GOOD}, r"p.py: Policy itself is the base class"),
    ("two", {"policies/two.py": GOOD + GOOD.replace("FirstFree", "Second").split("\n", 2)[2]},
     r"policies/two.py: expected exactly one Policy subclass, found 2 \(FirstFree, Second\)"),
    ("none", {"policies/none.py": "x = 1\n"}, r"policies/none.py: expected exactly one Policy subclass, found 0"),
    ("random", {"policies/random.py": GOOD}, r"'random' is ambiguous: a built-in and .*policies/random.py"),
    ("{d}/p.py:NoName", {"p.py": "from tracebench.policies import Policy\nclass NoName(Policy):\n"
                         "    def assign(self, queue, servers):\n        return []\n"}, r"p.py: NoName has no `name`"),
    ("{d}/p.py:NoAssign", {"p.py": "from tracebench.policies import Policy\nclass NoAssign(Policy):\n"
                           "    name = 'x'\n"}, r"p.py: NoAssign does not implement assign"),
    ("{d}/p.py:X", {"p.py": "x = 1\ny = (\n"}, r"p.py:2: importing the policy failed: SyntaxError"),
    ("{d}/p.py:X", {"p.py": "x = 1\nimport no_such_module_here\n"},
     r"p.py:2: importing the policy failed: ModuleNotFoundError"),
])
def test_load_errors(tmp_path: Path, spec: str, files: dict[str, str], match: str) -> None:
    for name, text in files.items():
        write(tmp_path / name, text)
    with pytest.raises(PolicyError, match=match):
        load(spec.format(d=tmp_path), tmp_path / "policies")


def test_option_errors_from_a_user_policy(tmp_path: Path) -> None:
    path = str(REPO / "policies" / "example_least_loaded.py")
    with pytest.raises(ConfigError, match=r"policy 'least_loaded': unknown option\(s\) weight \(it accepts: waiting_weight\)"):
        load(path, tmp_path, weight="1")
    with pytest.raises(ConfigError, match=r"policy 'least_loaded': option waiting_weight='lots'"):
        load(path, tmp_path, waiting_weight="lots")
    with pytest.raises(ConfigError, match=r"policy 'first_free': unknown option\(s\) a \(it accepts: none\)"):
        load(str(write(tmp_path / "p.py", GOOD)), tmp_path, a="1")
