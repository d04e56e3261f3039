"""Pieces of the DeepSeek-V3 layers checked on their own: the absorbed per-head products."""

from __future__ import annotations

import torch

import portable_kernels as pk
from portable_kernels.models.deepseek.layers import HeadProduct
from portable_kernels.testing.generators import randn


def _keep(t, dtype):
    return t.to(dtype)


def test_head_product_keeps_bf16_only_when_exact_and_both_forms_agree():
    heads, n, k, t = 4, 48, 64, 3
    w = pk.dequantize(pk.per_block_cast_to_fp8(randn(heads * n, k, seed=1), use_ue8m0=True)).float()
    w = w.view(heads, n, k)  # power-of-two-scaled FP8 values: exact in bf16
    x = randn(t, heads, k, seed=2, dtype=torch.bfloat16)
    exact = HeadProduct.of(w, _keep)
    assert exact.w.dtype == torch.bfloat16
    inexact = HeadProduct.of(w * 1.001, _keep)  # no longer representable in bf16
    assert inexact.w.dtype == torch.float32
    want = torch.einsum("thk,hnk->thn", x.double(), w.double())
    got = exact(x)
    assert got.shape == (t, heads, n) and got.dtype == torch.bfloat16
    assert float(pk.calc_diff(got.double(), want)) < 1e-5
    assert float(pk.calc_diff(inexact(x).double(), want * 1.001)) < 1e-5
    assert torch.equal(exact(x), HeadProduct(w)(x))  # the GEMM's single rounding = einsum's, here
