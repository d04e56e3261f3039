"""Conformance cases for the MoE grouped GEMMs (contiguous m_indices and psum forms, masked), FP8
and bf16: valid rows against fp64 references from dequantized operands; padding rows of the
contiguous forms zero (ensure_zero_padding=True) or untouched (False), of the masked form untouched.

Layouts are built inside each case with the running backend's alignment
(get_m_alignment_for_contiguous_layout), so the same cases check 128 (NVIDIA) and 256 (Ascend);
one case per op sets a process-wide alignment of 224 (DeepGEMM's SM100 value) for its duration.
"""

from __future__ import annotations

import functools

import torch

from ..core.alignment import alignment_override, set_mk_alignment_for_contiguous_layout
from ..core.alignment import get_m_alignment_for_contiguous_layout
from ..ops.gemm.grouped import (M_GROUPED_FP8_CONTIGUOUS,
                            grouped_gemm_contiguous_reference, grouped_gemm_masked_reference,
                            m_grouped_bf16_gemm_nt_contiguous, m_grouped_bf16_gemm_nt_masked,
                            m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked)
from ..layouts.moe import contiguous_m_indices, m_indices_from_psum, psum_layout
from ..core.prepare import prepare_inputs
from ..ops.quant.fp8 import dequantize_reference, quantize_blocks_reference
from ..core.tensors import QuantTensor
from .checks import assert_close, assert_written
from .core import Case, CaseFailure, conformance_cases
from .generators import generator, poison, randn

#: calc_diff bound against the fp64 reference when D is rounded to bf16 (the rounding dominates)
BF16_OUTPUT_BOUND = 1e-5
FP32_OUTPUT_BOUND = M_GROUPED_FP8_CONTIGUOUS.tolerance.dequantized

# (G, N, K, rows per group as a fraction of the alignment; None draws them at random)
QUICK_CONTIGUOUS = [(3, 64, 256, (0.04, 0.0, 1.02)), (1, 32, 7, (1.0,)), (4, 48, 384, None)]
FULL_CONTIGUOUS = QUICK_CONTIGUOUS + [(8, 512, 2048, None), (16, 256, 7168, None)]
# (G, max_m, N, K, masked_m)
QUICK_MASKED = [(3, 40, 64, 256, (3, 0, 40)), (2, 1, 16, 130, (1, 0))]
FULL_MASKED = QUICK_MASKED + [(8, 256, 512, 2048, None), (4, 1024, 256, 7168, None)]


def _counts(groups: int, fractions, alignment: int, seed: int) -> torch.Tensor:
    if fractions is None:
        return torch.randint(0, 2 * alignment, (groups,), generator=generator(seed))
    return torch.tensor([round(f * alignment) for f in fractions], dtype=torch.int64)


def _masked_m(groups: int, max_m: int, given, seed: int) -> torch.Tensor:
    if given is None:
        return torch.randint(0, max_m + 1, (groups,), generator=generator(seed), dtype=torch.int32)
    return torch.tensor(given, dtype=torch.int32)


def _quantized(x: torch.Tensor, granularity: tuple[int, int]) -> QuantTensor:
    """x quantized by the contract's reference math (so a case checks the GEMM, not a quantizer)."""
    data, scale = quantize_blocks_reference(x.cpu(), *granularity, True)
    return QuantTensor(data.to(x.device), scale.to(x.device), granularity, ue8m0=True)


def _check_rows(d: torch.Tensor, ref: torch.Tensor, valid: torch.Tensor, bound: float, zeroed: bool = False) -> float:
    """Valid rows written and close to `ref`; every other row zero (`zeroed`) or still the poison (NaN)."""
    assert_written(d[valid], "d (valid rows)")
    padding = d[~valid].float()
    if zeroed and padding.numel() and bool(padding.ne(0).any()):
        raise CaseFailure(f"d: {int(padding.ne(0).any(-1).sum())} padding rows are not zero; "
                          f"ensure_zero_padding=True zeroes every row that belongs to no group")
    if not zeroed and padding.numel() and not bool(torch.isnan(padding).all()):
        raise CaseFailure(f"d: {int((~torch.isnan(padding)).any(-1).sum())} padding rows were written; "
                          f"the contract leaves them untouched here")
    return assert_close(d[valid], ref[valid], bound, "d (valid rows) vs dequantized reference")


def _contiguous_case(fp8: bool, psum: bool, groups: int, n: int, k: int, fractions, out_dtype: torch.dtype,
                     zero_padding: bool, set_alignment: int | None, seed: int, device: torch.device) -> float:
    if set_alignment is None:
        return _contiguous_run(fp8, psum, groups, n, k, fractions, out_dtype, zero_padding, seed, device)
    outer = alignment_override()
    set_mk_alignment_for_contiguous_layout(set_alignment)
    try:
        return _contiguous_run(fp8, psum, groups, n, k, fractions, out_dtype, zero_padding, seed, device)
    finally:
        set_mk_alignment_for_contiguous_layout(outer)


def _contiguous_run(fp8: bool, psum: bool, groups: int, n: int, k: int, fractions, out_dtype: torch.dtype,
                    zero_padding: bool, seed: int, device: torch.device) -> float:
    alignment = get_m_alignment_for_contiguous_layout()
    counts = _counts(groups, fractions, alignment, seed)
    m_indices = contiguous_m_indices(counts, alignment)
    total_m = m_indices.numel()
    layout = psum_layout(counts, alignment) if psum else m_indices
    x = randn(total_m, k, seed=seed + 1, dtype=torch.bfloat16, device=device)
    w = randn(groups, n, k, seed=seed + 2, dtype=torch.bfloat16, device=device, scale=k ** -0.5)
    d = poison(total_m, n, dtype=out_dtype, device=device)
    if fp8:
        a, b = _quantized(x, (1, 128)), _quantized(w, (128, 128))
        prepared = prepare_inputs(m_grouped_fp8_gemm_nt_contiguous, a=a, b=b)
        m_grouped_fp8_gemm_nt_contiguous(prepared["a"], prepared["b"], d, layout.to(device), use_psum_layout=psum,
                                         ensure_zero_padding=zero_padding)
        da, db = dequantize_reference(a).cpu().double(), dequantize_reference(b).cpu().double()
    else:
        m_grouped_bf16_gemm_nt_contiguous(x, w, d, layout.to(device), use_psum_layout=psum,
                                          ensure_zero_padding=zero_padding)
        da, db = x.cpu().double(), w.cpu().double()
    groups_of_rows = m_indices_from_psum(layout, alignment, total_m) if psum else m_indices
    ref = grouped_gemm_contiguous_reference(da, db, groups_of_rows)
    bound = FP32_OUTPUT_BOUND if out_dtype == torch.float32 else BF16_OUTPUT_BOUND
    return _check_rows(d.cpu(), ref, groups_of_rows >= 0, bound, zeroed=zero_padding)


def _masked_case(fp8: bool, groups: int, max_m: int, n: int, k: int, given, out_dtype: torch.dtype, seed: int,
                 device: torch.device) -> float:
    masked_m = _masked_m(groups, max_m, given, seed)
    x = randn(groups, max_m, k, seed=seed + 1, dtype=torch.bfloat16, device=device)
    w = randn(groups, n, k, seed=seed + 2, dtype=torch.bfloat16, device=device, scale=k ** -0.5)
    d = poison(groups, max_m, n, dtype=out_dtype, device=device)
    expected_m = max(1, int(masked_m.float().mean()))
    if fp8:
        a, b = _quantized(x, (1, 128)), _quantized(w, (128, 128))
        prepared = prepare_inputs(m_grouped_fp8_gemm_nt_masked, a=a, b=b)
        m_grouped_fp8_gemm_nt_masked(prepared["a"], prepared["b"], d, masked_m.to(device), expected_m)
        da, db = dequantize_reference(a).cpu().double(), dequantize_reference(b).cpu().double()
    else:
        m_grouped_bf16_gemm_nt_masked(x, w, d, masked_m.to(device), expected_m)
        da, db = x.cpu().double(), w.cpu().double()
    valid = torch.arange(max_m)[None, :] < masked_m[:, None]
    bound = FP32_OUTPUT_BOUND if out_dtype == torch.float32 else BF16_OUTPUT_BOUND
    return _check_rows(d.cpu(), grouped_gemm_masked_reference(da, db), valid, bound)


#: DeepGEMM's contiguous alignment on SM100 (its block size), not a multiple of 128
SET_ALIGNMENT = 224


def _contiguous_cases(op: str, fp8: bool, quick: bool, seed0: int) -> list[Case]:
    cases = []
    for i, (groups, n, k, fractions) in enumerate(QUICK_CONTIGUOUS if quick else FULL_CONTIGUOUS):
        for psum in (False, True):
            out_dtype = torch.bfloat16 if (i + psum) % 2 == 0 else torch.float32
            zero_padding = (i + psum) % 3 != 2
            seed = seed0 + 10 * i + psum
            label = (f"G={groups} n={n} k={k} counts={fractions or 'random'} psum={psum} d={str(out_dtype)[6:]} "
                     f"zero_padding={zero_padding}")
            run = functools.partial(_contiguous_case, fp8, psum, groups, n, k, fractions, out_dtype, zero_padding,
                                    None, seed)
            cases.append(Case(op, label, seed, run))
    for psum in (False, True):
        seed = seed0 + 90 + psum
        run = functools.partial(_contiguous_case, fp8, psum, 3, 32, 256, (0.9, 0.15, 1.3), torch.float32, True,
                                SET_ALIGNMENT, seed)
        cases.append(Case(op, f"G=3 n=32 k=256 alignment set to {SET_ALIGNMENT} psum={psum}", seed, run))
    return cases


def _masked_cases(op: str, fp8: bool, quick: bool, seed0: int) -> list[Case]:
    cases = []
    for i, (groups, max_m, n, k, given) in enumerate(QUICK_MASKED if quick else FULL_MASKED):
        for out_dtype in (torch.bfloat16, torch.float32):
            seed = seed0 + 10 * i + (out_dtype == torch.float32)
            label = f"G={groups} max_m={max_m} n={n} k={k} masked_m={given or 'random'} d={str(out_dtype)[6:]}"
            cases.append(Case(op, label, seed,
                              functools.partial(_masked_case, fp8, groups, max_m, n, k, given, out_dtype, seed)))
    return cases


@conformance_cases("m_grouped_fp8_gemm_nt_contiguous")
def fp8_contiguous_cases(quick: bool) -> list[Case]:
    return _contiguous_cases("m_grouped_fp8_gemm_nt_contiguous", True, quick, 5000)


@conformance_cases("m_grouped_fp8_gemm_nt_masked")
def fp8_masked_cases(quick: bool) -> list[Case]:
    return _masked_cases("m_grouped_fp8_gemm_nt_masked", True, quick, 5100)


@conformance_cases("m_grouped_bf16_gemm_nt_contiguous")
def bf16_contiguous_cases(quick: bool) -> list[Case]:
    return _contiguous_cases("m_grouped_bf16_gemm_nt_contiguous", False, quick, 5200)


@conformance_cases("m_grouped_bf16_gemm_nt_masked")
def bf16_masked_cases(quick: bool) -> list[Case]:
    return _masked_cases("m_grouped_bf16_gemm_nt_masked", False, quick, 5300)
