"""Case-list upstream files (FlashMLA style): upstream's own main() enumerates, a sample runs."""

from __future__ import annotations

import dataclasses
import textwrap
import types
from pathlib import Path

import attrs
import pytest

from portable_kernels.tools.upstream_suites import flashmla
from portable_kernels.tools.upstream_suites.cases import Case, CaseDriver, collect, pick, with_seed
from portable_kernels.tools.upstream_suites.common import DEVICE_RULES
from portable_kernels.tools.upstream_suites.engine import Backend, Suite, prepare_tree, run_suite, summarize

FAKE_TEST = '''
import dataclasses
import torch

calls = []

@dataclasses.dataclass
class P:
    n: int
    ok: bool = True
    seed: int = -1
    num_runs: int = 10

def run_case(p):
    calls.append(p)
    assert scale == 2 * p.n, "the loop's global was not restored"
    if p.n == 3:
        raise ValueError("case three raises\\nsecond line")
    assert p.num_runs == 0, "profiling repetitions were left on"
    return p.ok and torch.ones(1, device='cuda').device.type == 'cpu'

if __name__ == '__main__':
    for n, ok in [(1, True), (2, False), (3, True), (1000, True)]:
        scale = 2 * n
        assert run_case(P(n, ok)) is True
'''

DRIVERS_SOURCE = '''
import copy
from portable_kernels.tools.upstream_suites.cases import CaseDriver

def _prepare(args):
    p = copy.copy(args[0])
    p.num_runs = 0
    return (p,)

DRIVERS = {"test_fake_cases.py": CaseDriver(function="run_case", entry="_pk_main()", stub=lambda m: True,
                                            passed=lambda r: r is True, cost=lambda a: a[0].n, max_cost=100,
                                            prepare=_prepare, captured=("scale",),
                                            label=lambda a: f"n={a[0].n}")}
'''


def _checkout(tmp_path: Path) -> Path:
    checkout = tmp_path / "upstream"
    (checkout / "tests").mkdir(parents=True)
    (checkout / "tests" / "test_fake_cases.py").write_text(textwrap.dedent(FAKE_TEST))
    (checkout / "tests" / "fake_case_drivers.py").write_text(textwrap.dedent(DRIVERS_SOURCE))
    return checkout


def _suite() -> Suite:
    # the sparse prefill file's `if __name__ == '__main__':` rule, with the fmha file's `global` line
    main_rule = attrs.evolve(flashmla.FILE_RULES[1], replacement="def _pk_main():\n    global scale",
                             files=("test_fake_cases.py",))
    return Suite(name="FakeCases", copy=(("tests", "tests"),), files=("tests/test_fake_cases.py",), kind="cases",
                 rules=DEVICE_RULES + (main_rule,), drivers="fake_case_drivers")


@pytest.fixture(scope="module")
def case_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cases")
    results, _ = run_suite(_suite(), _checkout(tmp_path), [Backend.parse("cpu")], workdir=tmp_path / "work")
    return {r.name: r for r in results}


def test_each_enumerated_case_is_run_and_judged(case_run):
    assert case_run["run_case[0] n=1"].outcome == "passed"
    assert case_run["run_case[1] n=2"].outcome == "failed"
    assert "incorrect results" in case_run["run_case[1] n=2"].first_line
    assert case_run["run_case[2] n=3"].first_line == "ValueError: case three raises"


def test_a_case_over_the_size_cap_is_counted_not_run(case_run):
    assert not any("n=1000" in name for name in case_run)
    skipped = case_run["<not run>"]
    assert skipped.outcome == "skipped" and "1 over the CPU size cap" in skipped.reason
    counts = summarize(list(case_run.values()))[("tests/test_fake_cases.py", "cpu")]
    assert (counts.run, counts.passed, counts.failed, counts.skipped) == (3, 1, 2, 1)


def test_collect_lists_cases_in_order_without_running_them():
    module = types.ModuleType("fake")
    exec(textwrap.dedent('''
        ran = []
        def f(x):
            ran.append(x)
            return "real"
        def main():
            for i in range(5):
                k = i * 10
                assert f(i) == "stub"
    '''), vars(module))
    driver = CaseDriver(function="f", entry="main()", stub=lambda m: "stub", passed=bool, cost=lambda a: a[0],
                        captured=("k",))
    cases = collect(module, driver)
    assert [c.args for c in cases] == [(i,) for i in range(5)]
    assert module.ran == [] and module.f(7) == "real"  # the real function is back


def test_pick_samples_every_group_and_respects_the_cap():
    cases = [Case(i, (i,), {}, None) for i in range(40)]
    driver = CaseDriver(function="f", entry="", stub=lambda m: None, passed=bool, cost=lambda a: a[0], max_cost=29,
                        group=lambda a: a[0] % 3)
    picked, over = pick(cases, driver, sample=6, seed="x")
    assert over == 10 and len(picked) == 6
    assert sorted({c.args[0] % 3 for c in picked}) == [0, 1, 2]
    assert all(c.args[0] <= 29 for c in picked)
    assert picked == sorted(picked, key=lambda c: c.index)
    assert pick(cases, driver, sample=6, seed="x") == (picked, over)  # seeded
    assert len(pick(cases, driver, sample=0, seed="x")[0]) == 30


def test_a_seed_left_at_minus_one_gets_the_full_run_counter_value():
    @dataclasses.dataclass
    class P:
        seed: int = -1

    assert with_seed((P(),), 17)[0].seed == 17
    assert with_seed((P(seed=5),), 17)[0].seed == 5


def test_flashmla_rules_map_the_main_blocks(tmp_path):
    checkout = tmp_path / "fm"
    (checkout / "tests").mkdir(parents=True)
    (checkout / "tests" / "test_flash_mla_sparse_prefill.py").write_text(
        "import flash_mla\nif __name__ == '__main__':\n    device = torch.device(\"cuda:0\")\n")
    prepare_tree(flashmla.SUITE, checkout, tmp_path / "tree")
    text = (tmp_path / "tree" / "tests" / "test_flash_mla_sparse_prefill.py").read_text()
    assert "import portable_kernels.flash_mla as flash_mla" in text
    assert "def _pk_main():" in text and 'torch.device("cpu")' in text
    assert set(flashmla.DRIVERS) == {Path(f).name for f in flashmla.SUITE.files}


FAKE_PROGRAM = '''
import os
import sys
from portable_kernels.core.registry import forced_backend

backend = forced_backend()
assert backend == ("nvidia", {"arch": "sm90"}), backend
assert os.environ["WORLD_SIZE"] == "2" and os.environ["RANK"] in ("0", "1")
if "--fail" in sys.argv:
    raise ValueError("node %s refuses" % os.environ["RANK"])
'''


def test_a_program_runs_on_every_node_under_the_backend(tmp_path):
    from portable_kernels.tools.upstream_suites.engine import Program

    checkout = tmp_path / "up"
    (checkout / "tests").mkdir(parents=True)
    (checkout / "tests" / "test_prog.py").write_text(textwrap.dedent(FAKE_PROGRAM))
    suite = Suite(name="FakeProgram", copy=(("tests", "tests"),), files=("tests/test_prog.py",), kind="program",
                  rules=(), programs=(Program("tests/test_prog.py", (), "ok", nodes=2),
                                      Program("tests/test_prog.py", ("--fail",), "bad", nodes=2)))
    results, _ = run_suite(suite, checkout, [Backend.parse("nvidia:arch=sm90")], workdir=tmp_path / "work",
                           test_timeout=120)
    by_name = {r.name.split(" ")[0]: r for r in results}
    assert by_name["ok"].outcome == "passed", by_name["ok"]
    assert by_name["bad"].outcome == "failed"
    assert by_name["bad"].first_line.startswith("ValueError: node ") and "refuses" in by_name["bad"].first_line
