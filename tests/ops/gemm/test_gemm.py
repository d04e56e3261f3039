"""GEMM contracts against fp64 references from dequantized operands (and the unquantized product)."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.testing.generators import poison, randn


def _operands(m, n, k, seed, ue8m0=False):
    x = randn(m, k, seed=seed, dtype=torch.bfloat16)
    w = randn(n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
    return x, w, pk.per_token_cast_to_fp8(x, use_ue8m0=ue8m0), pk.per_block_cast_to_fp8(w, use_ue8m0=ue8m0)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 128, 128), (7, 130, 300), (64, 256, 1024), (33, 17, 7168)])
def test_fp8_gemm_fp32_out_matches_dequantized_fp64_reference(m, n, k):
    x, w, a, b = _operands(m, n, k, seed=m + n + k)
    d = poison(m, n, dtype=torch.float32)
    pk.fp8_gemm_nt(a, b, d)
    ref = pk.dequantize(a).double() @ pk.dequantize(b).double().T
    assert pk.calc_diff(d, ref) <= 1e-6
    assert pk.calc_diff(d, x.double() @ w.double().T) <= 1e-3


def test_fp8_gemm_adds_c():
    _, _, a, b = _operands(16, 64, 256, seed=11)
    c = randn(16, 64, seed=12)
    d = poison(16, 64, dtype=torch.float32)
    pk.fp8_gemm_nt(a, b, d, c=c)
    ref = pk.dequantize(a).double() @ pk.dequantize(b).double().T + c.double()
    assert pk.calc_diff(d, ref) <= 1e-6


def test_fp8_gemm_bf16_out_is_reference_rounded():
    _, _, a, b = _operands(32, 96, 640, seed=13)
    d = poison(32, 96, dtype=torch.bfloat16)
    pk.fp8_gemm_nt(a, b, d)
    ref = (pk.dequantize(a).double() @ pk.dequantize(b).double().T)
    assert torch.isfinite(d.float()).all()
    assert pk.calc_diff(d, ref) <= 1e-5


def test_fp8_gemm_empty_m_is_a_no_op():
    _, _, a, b = _operands(0, 64, 256, seed=14)
    d = torch.empty(0, 64, dtype=torch.bfloat16)
    pk.fp8_gemm_nt(a, b, d)
    assert d.shape == (0, 64)


def test_fp8_gemm_recipe_must_match_operands():
    _, _, a, b = _operands(4, 128, 256, seed=15)
    d = torch.empty(4, 128, dtype=torch.bfloat16)
    pk.fp8_gemm_nt(a, b, d, recipe=(1, 128, 128))
    with pytest.raises(pk.ContractError, match="recipe"):
        pk.fp8_gemm_nt(a, b, d, recipe=(1, 1, 128))


def test_fp8_gemm_accepts_raw_tuples_and_counts_the_conversion():
    _, _, a, b = _operands(4, 128, 256, seed=16)
    d = poison(4, 128, dtype=torch.float32)
    with pytest.warns(pk.ImplicitConversionWarning):
        pk.fp8_gemm_nt((a.data, a.scale), (b.data, b.scale), d)
    assert pk.implicit_conversions() == 2
    ref = pk.dequantize(a).double() @ pk.dequantize(b).double().T
    assert pk.calc_diff(d, ref) <= 1e-6


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (5, 130, 300), (0, 8, 16)])
def test_bf16_gemm_matches_fp64_reference(m, n, k):
    a = randn(m, k, seed=20, dtype=torch.bfloat16)
    b = randn(n, k, seed=21, dtype=torch.bfloat16)
    c = randn(m, n, seed=22)
    d = poison(m, n, dtype=torch.float32)
    pk.bf16_gemm_nt(a, b, d, c=c)
    assert pk.calc_diff(d, a.double() @ b.double().T + c.double()) <= 1e-6
