"""The upstream-suite engine on a tiny fake upstream tree (no upstream source needed)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import attrs
import pytest

from portable_kernels.tools.upstream_suites import deepgemm
from portable_kernels.tools.upstream_suites.common import DEVICE_RULES, HARDWARE
from portable_kernels.tools.upstream_suites.engine import (Backend, FileRule, Rule, Suite, CaseResult, classify,
                                                           format_report, prepare_tree, run_suite, summarize)

FAKE_TEST = '''
import torch
import deep_gemm
from deep_gemm.utils import ceil_div


def test_device_is_mapped():
    x = torch.ones(4, device='cuda')
    torch.cuda.synchronize()
    assert x.device.type == 'cpu'
    assert deep_gemm.__name__ == 'portable_kernels.deep_gemm'
    assert ceil_div(5, 4) == 2


def test_fails_with_a_message():
    raise ValueError("first line of the failure\\nsecond line")


def test_shape_was_cut():
    for m in (4096, 8192):
        assert m < 1000
'''

SHAPE_RULE = Rule(r"for m in \(4096, 8192\):", "for m in (64, 128):", "shape cut", ("test_fake.py",))


def _fake_checkout(tmp_path: Path) -> Path:
    checkout = tmp_path / "upstream"
    (checkout / "tests").mkdir(parents=True)
    (checkout / "tests" / "test_fake.py").write_text(textwrap.dedent(FAKE_TEST))
    return checkout


def _suite() -> Suite:
    return Suite(name="Fake", copy=(("tests/test_fake.py", "tests/test_fake.py"),), files=("tests/test_fake.py",),
                 kind="script", rules=deepgemm.IMPORT_RULES + DEVICE_RULES + (SHAPE_RULE,), hardware=HARDWARE,
                 skipped_files=(FileRule("tests/test_multi_gpu.py", "hardware", "two GPUs"),))


def test_rewrite_points_imports_at_the_drop_in_and_maps_the_device(tmp_path):
    tree = tmp_path / "tree"
    prepare_tree(_suite(), _fake_checkout(tmp_path), tree)
    text = (tree / "tests" / "test_fake.py").read_text()
    assert "import portable_kernels.deep_gemm as deep_gemm" in text
    assert "from portable_kernels.deep_gemm.utils import ceil_div" in text
    assert "device='cpu'" in text and "'cuda'" not in text
    assert "for m in (64, 128):" in text


def test_a_rule_that_matches_nothing_is_reported(tmp_path):
    stale = Rule(r"no such line", "x", "stale", ("test_fake.py",))
    suite = _suite()
    suite = attrs.evolve(suite, rules=suite.rules + (stale,))
    notes = prepare_tree(suite, _fake_checkout(tmp_path), tmp_path / "tree")
    assert any("no such line" in n for n in notes)


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("fake")
    results, _ = run_suite(_suite(), _fake_checkout(tmp_path), [Backend.parse("cpu")], workdir=tmp_path / "work")
    return results


def test_a_passing_test_is_counted(fake_run):
    by_name = {r.name: r for r in fake_run}
    assert by_name["test_device_is_mapped"].outcome == "passed"
    assert by_name["test_shape_was_cut"].outcome == "passed"


def test_a_failing_test_is_reported_with_its_first_line(fake_run):
    failed = {r.name: r for r in fake_run}["test_fails_with_a_message"]
    assert failed.outcome == "failed"
    assert failed.first_line == "ValueError: first line of the failure"
    assert "ValueError: first line of the failure" in format_report("Fake", fake_run)


def test_the_summary_counts_run_passed_failed_and_hardware_files(fake_run):
    counts = summarize(fake_run)
    assert counts[("tests/test_fake.py", "cpu")].run == 3
    assert counts[("tests/test_fake.py", "cpu")].passed == 2
    assert counts[("tests/test_fake.py", "cpu")].failed == 1
    multi = counts[("tests/test_multi_gpu.py", "cpu")]
    assert (multi.run, multi.hardware) == (0, 1)


def test_a_failure_naming_nvshmem_is_classified_as_hardware():
    result = classify(CaseResult("f.py", "test_x", "cpu", "failed", "RuntimeError: NVSHMEM is not initialized"),
                      HARDWARE)
    assert result.outcome == "hardware" and "NVSHMEM" in result.reason


def test_backend_spec_parses_name_and_options():
    assert Backend.parse("nvidia:arch=sm100") == Backend("nvidia", (("arch", "sm100"),))
    assert Backend.parse("ascend:soc=950").spec == "ascend:soc=950"
    with pytest.raises(ValueError, match="KEY=VALUE"):
        Backend.parse("nvidia:sm100")
