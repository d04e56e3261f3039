"""tf32_hc_prenorm_gemm: DeepGEMM's own check (the split sums against a·bᵀ and Σa², calc_diff
< 1e-8), the split rule exactly (each split is its K range's partial sum, ranges past K are zeros),
empty M, and the bad-input catalogue."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels import ContractError
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.ops.gemm.hc_prenorm import hc_prenorm_reference, split_ranges
from portable_kernels.testing.generators import poison, randn


def _call(m, n, k, splits, seed=1):
    a, b = randn(m, k, seed=seed, dtype=torch.bfloat16), randn(n, k, seed=seed + 1)
    lead = () if splits is None else (splits,)
    d, s = poison(*lead, m, n, dtype=torch.float32), poison(*lead, m, dtype=torch.float32)
    pk.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=splits)
    return a, b, d, s


@pytest.mark.parametrize("m,n,k", [(13, 24, 7168), (137, 24, 7680)])
@pytest.mark.parametrize("splits", [None, 16])
def test_deepgemms_own_check(m, n, k, splits):
    a, b, d, s = _call(m, n, k, splits)
    final_d, final_s = (d, s) if splits is None else (d.sum(0), s.sum(0))
    diff = max(pk.calc_diff(final_d, a.float() @ b.T), pk.calc_diff(final_s, a.float().square().sum(-1)))
    assert diff < 1e-8


def test_each_split_is_its_k_ranges_partial_sum():
    a, b, d, s = _call(9, 5, 10, 4)  # ranges of 3: [0,3) [3,6) [6,9) [9,10)
    assert split_ranges(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    for i, (lo, hi) in enumerate(split_ranges(10, 4)):
        want = a[:, lo:hi].double() @ b[:, lo:hi].double().T
        assert pk.calc_diff(d[i], want) < 1e-12
        assert torch.allclose(s[i].double(), a[:, lo:hi].double().square().sum(-1), rtol=1e-6)


def test_splits_past_k_are_exact_zeros():
    _, _, d, s = _call(3, 24, 5, 16)  # ranges of 1 column: splits 5..15 cover nothing
    assert not d[5:].any() and not s[5:].any() and d[:5].abs().sum() > 0


def test_empty_m_writes_nothing():
    d = torch.empty(0, 24)
    pk.tf32_hc_prenorm_gemm(torch.empty(0, 64, dtype=torch.bfloat16), randn(24, 64, seed=3), d, torch.empty(0))


def test_reference_is_the_formula():
    a, b = randn(4, 40, seed=5, dtype=torch.bfloat16), randn(3, 40, seed=6)
    d, s = hc_prenorm_reference(a, b)
    assert torch.allclose(d, a.float() @ b.T) and torch.allclose(s, (a.float() ** 2).sum(-1))


def test_cpu_runs_torch_blas_not_the_reference():
    with trace_providers() as ran:
        _call(5, 24, 300, None)
    assert ran == [("tf32_hc_prenorm_gemm", "cpu", "torch-blas")]


def _bad_calls():
    a, b = randn(6, 64, seed=7, dtype=torch.bfloat16), randn(24, 64, seed=8)
    d, s = torch.empty(6, 24), torch.empty(6)
    return {
        "a": lambda: pk.tf32_hc_prenorm_gemm(a.float(), b, d, s),
        "a strides": lambda: pk.tf32_hc_prenorm_gemm(torch.empty(64, 6, dtype=torch.bfloat16).T, b, d, s),
        "b": lambda: pk.tf32_hc_prenorm_gemm(a, b.bfloat16(), d, s),
        "b K": lambda: pk.tf32_hc_prenorm_gemm(a, b[:, :32], d, s),
        "b empty": lambda: pk.tf32_hc_prenorm_gemm(a, b[:0], d[:, :0], s),
        "d": lambda: pk.tf32_hc_prenorm_gemm(a, b, torch.empty(6, 23), s),
        "d splits": lambda: pk.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=4),
        "d dtype": lambda: pk.tf32_hc_prenorm_gemm(a, b, d.bfloat16(), s),
        "sqr_sum": lambda: pk.tf32_hc_prenorm_gemm(a, b, d, torch.empty(5)),
        "num_splits": lambda: pk.tf32_hc_prenorm_gemm(a, b, torch.empty(0, 6, 24), torch.empty(0, 6), num_splits=0),
    }


@pytest.mark.parametrize("name", list(_bad_calls()))
def test_bad_input_names_the_argument(name):
    with pytest.raises(ContractError, match=f"'{name.split()[0]}'"):
        _bad_calls()[name]()
