"""The conformance kit run against every in-tree backend (quick size), as a plugin author would."""

from __future__ import annotations

import pytest

import portable_kernels as pk
from portable_kernels.testing.core import covered_ops

IN_TREE = [("cpu", {}), ("nvidia", {"arch": "sm90"}), ("nvidia", {"arch": "sm100"}), ("ascend", {})]


@pytest.fixture(scope="module", params=IN_TREE, ids=lambda p: p[0] + ("-" + p[1]["arch"] if p[1] else ""))
def report(request, conformance_report):
    name, options = request.param
    return conformance_report(name, **options)


def test_no_case_fails(report):
    assert report.ok, report.format_table()


def test_every_op_with_a_reference_kernel_runs_on_the_backend(report):
    contracts = pk.contracts()
    for op, r in report.ops.items():
        if op in contracts and contracts[op].kernel is not None:
            assert r.passed > 0, f"{report.backend}: {op} ran no case\n{report.format_table()}"


def test_report_covers_every_op_with_cases(report):
    assert set(report.ops) == set(covered_ops())


def test_cpu_declines_no_case(report):
    if report.backend != "cpu":
        pytest.skip("only the reference backend must accept every case")
    declined = {op: r.unsupported for op, r in report.ops.items() if r.unsupported}
    assert not declined, declined
