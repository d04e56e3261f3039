"""MoE grouped GEMMs: valid rows against fp64 references from dequantized operands, padding rows
zeroed by default (untouched with ensure_zero_padding=False, and always in the masked form), both
contiguous forms, the backend's alignment, and the bad-input catalogue."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.layouts import NVIDIA_MOE_ALIGNMENT, contiguous_m_indices, m_indices_from_psum, psum_layout
from portable_kernels.testing import run_conformance
from portable_kernels.testing.generators import poison, randn

GROUPED_OPS = ["m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
               "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_masked"]
ALIGN = NVIDIA_MOE_ALIGNMENT  # the cpu backend keeps DeepGEMM's alignment


def _contiguous_inputs(counts, n, k, seed, ue8m0=False):
    counts = torch.tensor(counts)
    m_indices = contiguous_m_indices(counts, ALIGN)
    x = randn(m_indices.numel(), k, seed=seed, dtype=torch.bfloat16)
    w = randn(counts.numel(), n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
    a = pk.per_token_cast_to_fp8(x, use_ue8m0=ue8m0)
    b = pk.per_block_cast_to_fp8(w, use_ue8m0=ue8m0)
    return counts, m_indices, x, w, a, b


def _rowwise_reference(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor) -> torch.Tensor:
    """fp64 row-by-row oracle (independent of the op's packed bmm): row r = a[r] @ b[g]^T."""
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for g in range(b.shape[0]):
        rows = m_indices == g
        out[rows] = a[rows].double() @ b[g].double().T
    return out


@pytest.mark.parametrize("counts,n,k,ue8m0", [([5, 0, 130], 64, 256, False), ([128], 32, 7, True),
                                              ([1, 2, 3, 200], 96, 640, True)])
def test_fp8_contiguous_valid_rows_match_dequantized_fp64_reference(counts, n, k, ue8m0):
    _, m_indices, x, w, a, b = _contiguous_inputs(counts, n, k, seed=sum(counts) + k, ue8m0=ue8m0)
    d = poison(m_indices.numel(), n, dtype=torch.float32)
    pk.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
    valid = m_indices >= 0
    ref = _rowwise_reference(pk.dequantize(a), pk.dequantize(b), m_indices)
    assert pk.calc_diff(d[valid], ref[valid]) <= 1e-6
    assert pk.calc_diff(d[valid], _rowwise_reference(x, w, m_indices)[valid]) <= 1e-3


def test_fp8_contiguous_zeroes_padding_rows_by_default():
    _, m_indices, _, _, a, b = _contiguous_inputs([3, 0, 129], 48, 256, seed=1)
    d = poison(m_indices.numel(), 48, dtype=torch.bfloat16)
    pk.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
    assert torch.equal(d[m_indices < 0].float(), torch.zeros(int((m_indices < 0).sum()), 48))
    assert torch.isfinite(d[m_indices >= 0].float()).all()


def test_fp8_contiguous_leaves_padding_rows_untouched_without_ensure_zero_padding():
    _, m_indices, _, _, a, b = _contiguous_inputs([3, 0, 129], 48, 256, seed=1)
    d = poison(m_indices.numel(), 48, dtype=torch.bfloat16)
    pk.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, ensure_zero_padding=False)
    assert torch.isnan(d[m_indices < 0].float()).all()
    assert torch.isfinite(d[m_indices >= 0].float()).all()


def test_contiguous_ignores_padding_rows_of_a():
    _, m_indices, x, w, _, _ = _contiguous_inputs([7, 100], 32, 128, seed=2)
    x_nan = x.clone()
    x_nan[m_indices < 0] = float("nan")
    d1, d2 = (poison(m_indices.numel(), 32, dtype=torch.float32) for _ in range(2))
    pk.m_grouped_bf16_gemm_nt_contiguous(x, w, d1, m_indices)
    pk.m_grouped_bf16_gemm_nt_contiguous(x_nan, w, d2, m_indices)
    valid = m_indices >= 0
    assert torch.equal(d1[valid], d2[valid])


def test_psum_layout_computes_the_same_rows_as_m_indices():
    counts, m_indices, _, _, a, b = _contiguous_inputs([5, 0, 130, 1], 64, 256, seed=3)
    psum = psum_layout(counts, ALIGN)
    d_idx, d_psum = (poison(m_indices.numel(), 64, dtype=torch.float32) for _ in range(2))
    pk.m_grouped_fp8_gemm_nt_contiguous(a, b, d_idx, m_indices)
    pk.m_grouped_fp8_gemm_nt_contiguous(a, b, d_psum, psum, use_psum_layout=True, expected_m_for_psum_layout=64,
                                        ensure_zero_padding=False)
    valid = m_indices >= 0
    assert torch.equal(d_idx[valid], d_psum[valid])
    assert torch.isnan(d_psum[~valid]).all()
    assert not d_idx[~valid].any()


@pytest.mark.parametrize("ensure_zero_padding", [True, False])
def test_psum_gaps_and_rows_past_the_last_group_are_zeroed_or_untouched(ensure_zero_padding):
    counts = torch.tensor([3, 4])
    psum = psum_layout(counts, ALIGN)  # [3, 132]: rows 3..127 are a gap, 132.. are the tail
    total = 3 * ALIGN
    a = randn(total, 64, seed=4, dtype=torch.bfloat16)
    b = randn(2, 16, 64, seed=5, dtype=torch.bfloat16)
    d = poison(total, 16, dtype=torch.float32)
    pk.m_grouped_bf16_gemm_nt_contiguous(a, b, d, psum, use_psum_layout=True, ensure_zero_padding=ensure_zero_padding)
    rows = m_indices_from_psum(psum, ALIGN, total)
    assert int((rows >= 0).sum()) == 7
    padding = d[rows < 0]
    assert (not padding.any()) if ensure_zero_padding else torch.isnan(padding).all()
    ref = _rowwise_reference(a, b, rows)
    assert pk.calc_diff(d[rows >= 0], ref[rows >= 0]) <= 1e-6


def test_m_indices_may_end_with_extra_padding_rows():
    m_indices = torch.cat((contiguous_m_indices(torch.tensor([2, 3]), ALIGN), torch.full((5,), -1)))
    m_indices = m_indices.to(torch.int32)
    a = randn(m_indices.numel(), 32, seed=6, dtype=torch.bfloat16)
    b = randn(2, 8, 32, seed=7, dtype=torch.bfloat16)
    d = poison(m_indices.numel(), 8, dtype=torch.float32)
    pk.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices, ensure_zero_padding=False)
    assert torch.isnan(d[-5:]).all()


def test_contiguous_with_no_rows_is_a_no_op():
    a = pk.per_token_cast_to_fp8(randn(0, 256, seed=8))
    b = pk.per_block_cast_to_fp8(randn(2, 16, 256, seed=9))
    d = torch.empty(0, 16, dtype=torch.bfloat16)
    pk.m_grouped_fp8_gemm_nt_contiguous(a, b, d, torch.empty(0, dtype=torch.int32))
    assert d.shape == (0, 16)


@pytest.mark.parametrize("out_dtype,bound", [(torch.float32, 1e-6), (torch.bfloat16, 1e-5)])
def test_fp8_masked_matches_reference_and_leaves_rows_past_masked_m(out_dtype, bound):
    g, max_m, n, k = 3, 40, 64, 384
    x = randn(g, max_m, k, seed=10, dtype=torch.bfloat16)
    w = randn(g, n, k, seed=11, dtype=torch.bfloat16, scale=k ** -0.5)
    a, b = pk.per_token_cast_to_fp8(x), pk.per_block_cast_to_fp8(w)
    masked_m = torch.tensor([3, 0, 40], dtype=torch.int32)
    d = poison(g, max_m, n, dtype=out_dtype)
    pk.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m=16)
    valid = torch.arange(max_m)[None, :] < masked_m[:, None]
    ref = torch.einsum("gmk,gnk->gmn", pk.dequantize(a).double(), pk.dequantize(b).double())
    assert pk.calc_diff(d[valid], ref[valid]) <= bound
    assert torch.isnan(d[~valid].float()).all()


def test_bf16_masked_matches_fp64_reference():
    a = randn(2, 17, 96, seed=12, dtype=torch.bfloat16)
    b = randn(2, 24, 96, seed=13, dtype=torch.bfloat16)
    masked_m = torch.tensor([17, 5], dtype=torch.int32)
    d = poison(2, 17, 24, dtype=torch.float32)
    pk.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, 11)
    valid = torch.arange(17)[None, :] < masked_m[:, None]
    ref = torch.einsum("gmk,gnk->gmn", a.double(), b.double())
    assert pk.calc_diff(d[valid], ref[valid]) <= 1e-6
    assert torch.isnan(d[~valid]).all()


def test_prepared_weights_convert_nothing_and_raw_tuples_are_counted():
    _, m_indices, _, _, a, b = _contiguous_inputs([4, 9], 32, 256, seed=14)
    prepared = pk.prepare_inputs(pk.m_grouped_fp8_gemm_nt_contiguous, a=a, b=b)
    d1 = poison(m_indices.numel(), 32, dtype=torch.float32)
    pk.m_grouped_fp8_gemm_nt_contiguous(prepared["a"], prepared["b"], d1, m_indices)
    assert pk.implicit_conversions() == 0
    d2 = poison(m_indices.numel(), 32, dtype=torch.float32)
    with pytest.warns(pk.ImplicitConversionWarning):
        pk.m_grouped_fp8_gemm_nt_contiguous((a.data, a.scale), (b.data, b.scale), d2, m_indices)
    assert pk.implicit_conversions() == 2
    valid = m_indices >= 0
    assert torch.equal(d1[valid], d2[valid])


def test_alignment_defaults_to_128_on_cpu():
    assert pk.get_m_alignment_for_contiguous_layout() == ALIGN
    with pk.use_backend("cpu"):
        assert pk.get_m_alignment_for_contiguous_layout() == ALIGN


def test_alignment_follows_the_running_backend(monkeypatch):
    monkeypatch.setattr(pk.registry().backend("cpu"), "moe_alignment", 256)
    assert pk.get_m_alignment_for_contiguous_layout() == 256
    counts = torch.tensor([3, 5])
    a = randn(512, 32, seed=15, dtype=torch.bfloat16)
    b = randn(2, 8, 32, seed=16, dtype=torch.bfloat16)
    d = poison(512, 8, dtype=torch.float32)
    pk.m_grouped_bf16_gemm_nt_contiguous(a, b, d, contiguous_m_indices(counts, 256))
    with pytest.raises(pk.ContractError, match="alignment 256"):
        pk.m_grouped_bf16_gemm_nt_contiguous(a, b, d, torch.cat((contiguous_m_indices(counts, 128),
                                                                 torch.full((256,), -1, dtype=torch.int32))))


def test_grouped_ops_pass_quick_conformance_on_cpu():
    report = run_conformance(backend="cpu", ops=GROUPED_OPS, quick=True)
    assert report.ok, report.format_table()


# -- bad-input catalogue ----------------------------------------------------------------------------

_X = randn(2 * ALIGN, 256, seed=20, dtype=torch.bfloat16)
_W = randn(2, 16, 256, seed=21, dtype=torch.bfloat16)
A = pk.per_token_cast_to_fp8(_X)
B = pk.per_block_cast_to_fp8(_W)
IDX = contiguous_m_indices(torch.tensor([5, 7]), ALIGN)
PSUM = psum_layout(torch.tensor([5, 7]), ALIGN)
D = torch.empty(2 * ALIGN, 16, dtype=torch.bfloat16)
AM = pk.per_token_cast_to_fp8(randn(2, 8, 256, seed=22))
DM = torch.empty(2, 8, 16, dtype=torch.bfloat16)
MM = torch.tensor([3, 8], dtype=torch.int32)


def _idx(*values):
    out = IDX.clone()
    for row, value in values:
        out[row] = value
    return out


FP8_CONTIGUOUS_CASES = {
    "a plain tensor": (lambda: ((_X, B, D, IDX), {}), "'a'"),
    "a 3-D": (lambda: ((AM, B, D, IDX), {}), "'a'"),
    "a per-block scales": (lambda: ((pk.per_block_cast_to_fp8(_X), B, D, IDX), {}), "'a'"),
    "b 2-D": (lambda: ((A, pk.per_block_cast_to_fp8(_W[0]), D, IDX), {}), "'b'"),
    "b wrong K": (lambda: ((A, pk.per_block_cast_to_fp8(randn(2, 16, 128, seed=1)), D, IDX), {}), "'b'"),
    "b other gran_k": (lambda: ((A, pk.per_block_cast_to_fp8(_W, block=(128, 64)), D, IDX), {}), "'b'"),
    "d fp16": (lambda: ((A, B, D.half(), IDX), {}), "'d'"),
    "d wrong N": (lambda: ((A, B, torch.empty(2 * ALIGN, 17, dtype=torch.bfloat16), IDX), {}), "'d'"),
    "d not contiguous": (lambda: ((A, B, torch.empty(16, 2 * ALIGN, dtype=torch.bfloat16).T, IDX), {}), "'d'"),
    "d on meta": (lambda: ((A, B, D.to("meta"), IDX), {}), "'d'"),
    "m_indices int64": (lambda: ((A, B, D, IDX.long()), {}), "'m_indices'"),
    "m_indices short": (lambda: ((A, B, D, IDX[:-1]), {}), "'m_indices'"),
    "m_indices on meta": (lambda: ((A, B, D, IDX.to("meta")), {}), "'m_indices'"),
    "m_indices group out of range": (lambda: ((A, B, D, _idx((0, 2))), {}), "'m_indices'"),
    "m_indices below -1": (lambda: ((A, B, D, _idx((0, -2))), {}), "'m_indices'"),
    "m_indices segment not aligned": (lambda: ((A, B, D, _idx((5, 0), (ALIGN, -1))), {}), "'m_indices'"),
    "m_indices groups descending": (lambda: ((A, B, D, IDX.flip(0)), {}), "'m_indices'"),
    "m_indices padding inside a group": (lambda: ((A, B, D, _idx((2, -1))), {}), "'m_indices'"),
    "psum given as m_indices": (lambda: ((A, B, D, IDX), {"use_psum_layout": True}), "'m_indices'"),
    "psum decreasing": (lambda: ((A, B, D, torch.tensor([200, 100], dtype=torch.int32)),
                                 {"use_psum_layout": True}), "'m_indices'"),
    "psum past M": (lambda: ((A, B, D, torch.tensor([5, 300], dtype=torch.int32)), {"use_psum_layout": True}),
                    "'m_indices'"),
    "use_psum_layout not bool": (lambda: ((A, B, D, IDX), {"use_psum_layout": 1}), "'use_psum_layout'"),
    "expected_m without psum": (lambda: ((A, B, D, IDX), {"expected_m_for_psum_layout": 64}),
                                "'expected_m_for_psum_layout'"),
    "expected_m zero": (lambda: ((A, B, D, PSUM), {"use_psum_layout": True, "expected_m_for_psum_layout": 0}),
                        "'expected_m_for_psum_layout'"),
    "recipe mismatch": (lambda: ((A, B, D, IDX, (1, 1, 128)), {}), "'recipe'"),
}


@pytest.mark.parametrize("name", list(FP8_CONTIGUOUS_CASES))
def test_m_grouped_fp8_gemm_nt_contiguous_bad_input(name):
    build, arg = FP8_CONTIGUOUS_CASES[name]
    args, kwargs = build()
    with pytest.raises(pk.ContractError, match=arg):
        pk.m_grouped_fp8_gemm_nt_contiguous(*args, **kwargs)


FP8_MASKED_CASES = {
    "a 2-D": (lambda: (A, B, DM, MM, 4), "'a'"),
    "a group count": (lambda: (pk.per_token_cast_to_fp8(randn(3, 8, 256, seed=1)), B, DM, MM, 4), "'a'"),
    "b not quantized": (lambda: (AM, _W, DM, MM, 4), "'b'"),
    "d wrong max_m": (lambda: (AM, B, torch.empty(2, 9, 16, dtype=torch.bfloat16), MM, 4), "'d'"),
    "masked_m float": (lambda: (AM, B, DM, MM.float(), 4), "'masked_m'"),
    "masked_m wrong length": (lambda: (AM, B, DM, MM[:1], 4), "'masked_m'"),
    "masked_m above max_m": (lambda: (AM, B, DM, torch.tensor([3, 9], dtype=torch.int32), 4), "'masked_m'"),
    "masked_m negative": (lambda: (AM, B, DM, torch.tensor([-1, 2], dtype=torch.int32), 4), "'masked_m'"),
    "masked_m on meta": (lambda: (AM, B, DM, MM.to("meta"), 4), "'masked_m'"),
    "expected_m zero": (lambda: (AM, B, DM, MM, 0), "'expected_m'"),
    "expected_m tensor": (lambda: (AM, B, DM, MM, torch.tensor(4)), "'expected_m'"),
}


@pytest.mark.parametrize("name", list(FP8_MASKED_CASES))
def test_m_grouped_fp8_gemm_nt_masked_bad_input(name):
    build, arg = FP8_MASKED_CASES[name]
    with pytest.raises(pk.ContractError, match=arg):
        pk.m_grouped_fp8_gemm_nt_masked(*build())


BF16_CONTIGUOUS_CASES = {
    "a fp32": (lambda: (_X.float(), _W, D, IDX), "'a'"),
    "b fp8": (lambda: (_X, B, D, IDX), "'b'"),
    "b no groups": (lambda: (_X, _W[:0], D, IDX), "'b'"),
    "b on meta": (lambda: (_X, _W.to("meta"), D, IDX), "'b'"),
    "d wrong M": (lambda: (_X, _W, D[:-1], IDX), "'d'"),
    "m_indices misaligned": (lambda: (_X, _W, D, _idx((5, 0), (ALIGN, -1))), "'m_indices'"),
}


@pytest.mark.parametrize("name", list(BF16_CONTIGUOUS_CASES))
def test_m_grouped_bf16_gemm_nt_contiguous_bad_input(name):
    build, arg = BF16_CONTIGUOUS_CASES[name]
    with pytest.raises(pk.ContractError, match=arg):
        pk.m_grouped_bf16_gemm_nt_contiguous(*build())


_XM = randn(2, 8, 256, seed=23, dtype=torch.bfloat16)
BF16_MASKED_CASES = {
    "a 2-D": (lambda: (_X, _W, DM, MM, 4), "'a'"),
    "b K mismatch": (lambda: (_XM, _W[..., :128], DM, MM, 4), "'b'"),
    "d fp8": (lambda: (_XM, _W, DM.to(torch.float8_e4m3fn), MM, 4), "'d'"),
    "masked_m above max_m": (lambda: (_XM, _W, DM, torch.tensor([3, 9], dtype=torch.int32), 4), "'masked_m'"),
    "expected_m bool": (lambda: (_XM, _W, DM, MM, True), "'expected_m'"),
}


@pytest.mark.parametrize("name", list(BF16_MASKED_CASES))
def test_m_grouped_bf16_gemm_nt_masked_bad_input(name):
    build, arg = BF16_MASKED_CASES[name]
    with pytest.raises(pk.ContractError, match=arg):
        pk.m_grouped_bf16_gemm_nt_masked(*build())


@pytest.mark.parametrize("mask", [[1, 1, 0, 0, 1, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0], [1] * 8, [0, 1, 0, 1, 0, 1, 0, 1]])
def test_zero_rows_on_cpu_is_the_masked_fill(mask):
    from portable_kernels.ops.gemm.grouped import zero_rows
    rows = torch.tensor(mask, dtype=torch.bool)
    d = randn(8, 5, seed=3, dtype=torch.bfloat16)
    want = d.masked_fill(rows[:, None], 0)
    zero_rows(d, rows)
    assert torch.equal(d, want)

