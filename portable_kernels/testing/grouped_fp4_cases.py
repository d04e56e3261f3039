"""Conformance cases for the grouped FP8 x FP4 GEMMs (contiguous m_indices and psum forms, masked):
valid rows against the fp64 reference from dequantized operands, padding rows zero (contiguous,
ensure_zero_padding) or untouched (masked). Layouts use the running backend's alignment."""

from __future__ import annotations

import functools

import torch

from ..ops.quant.fp4 import quantize_fp4_reference
from ..ops.gemm.grouped_fp4 import m_grouped_fp8_fp4_gemm_nt_contiguous, m_grouped_fp8_fp4_gemm_nt_masked
from ..core.alignment import get_m_alignment_for_contiguous_layout
from ..ops.gemm.grouped import grouped_gemm_contiguous_reference, \
    grouped_gemm_masked_reference
from ..layouts.constants import MX_BLOCK_K
from ..layouts.moe import contiguous_m_indices, m_indices_from_psum, psum_layout
from ..core.prepare import prepare_inputs
from ..ops.quant.fp8 import dequantize_reference, quantize_blocks_reference
from ..core.tensors import QuantTensor
from .core import Case, conformance_cases
from .generators import poison, randn
from .grouped_gemm_cases import BF16_OUTPUT_BOUND, _check_rows

# (G, N, K, rows per group as a fraction of the alignment)
QUICK_CONTIGUOUS = [(3, 64, 256, (0.04, 0.0, 1.02)), (2, 32, 64, (1.0, 0.5))]
FULL_CONTIGUOUS = QUICK_CONTIGUOUS + [(8, 512, 2048, (0.3, 1.2, 0.0, 0.9, 1.0, 0.1, 0.5, 1.9))]
QUICK_MASKED = [(3, 40, 64, 256, (3, 0, 40)), (2, 8, 16, 128, (8, 1))]
FULL_MASKED = QUICK_MASKED + [(6, 256, 512, 2048, (200, 0, 17, 256, 100, 1))]


def _operands(x: torch.Tensor, w: torch.Tensor, gran_k_a: int, device: torch.device):
    a = QuantTensor(*(t.to(device) for t in quantize_blocks_reference(x, 1, gran_k_a, True)), (1, gran_k_a), True)
    b = QuantTensor(*(t.to(device) for t in quantize_fp4_reference(w, MX_BLOCK_K, True)), (1, MX_BLOCK_K), True,
                    element="e2m1")
    return a, b


def _contiguous_case(groups: int, n: int, k: int, fractions, psum: bool, gran_k_a: int, seed: int,
                     device: torch.device) -> float:
    alignment = get_m_alignment_for_contiguous_layout()
    counts = torch.tensor([round(f * alignment) for f in fractions], dtype=torch.int64)
    m_indices = contiguous_m_indices(counts, alignment)
    layout = psum_layout(counts, alignment) if psum else m_indices
    x = randn(m_indices.numel(), k, seed=seed, dtype=torch.bfloat16)
    w = randn(groups, n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
    a, b = _operands(x, w, gran_k_a, device)
    prepared = prepare_inputs(m_grouped_fp8_fp4_gemm_nt_contiguous, a=a, b=b)
    d = poison(m_indices.numel(), n, dtype=torch.bfloat16, device=device)
    m_grouped_fp8_fp4_gemm_nt_contiguous(prepared["a"], prepared["b"], d, layout.to(device), use_psum_layout=psum)
    rows = m_indices_from_psum(layout, alignment, m_indices.numel()) if psum else m_indices
    ref = grouped_gemm_contiguous_reference(dequantize_reference(a).cpu().double(),
                                            dequantize_reference(b).cpu().double(), rows)
    return _check_rows(d.cpu(), ref, rows >= 0, BF16_OUTPUT_BOUND, zeroed=True)


def _masked_case(groups: int, max_m: int, n: int, k: int, given, seed: int, device: torch.device) -> float:
    masked_m = torch.tensor(given, dtype=torch.int32)
    x = randn(groups, max_m, k, seed=seed, dtype=torch.bfloat16)
    w = randn(groups, n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
    a, b = _operands(x, w, 128, device)
    prepared = prepare_inputs(m_grouped_fp8_fp4_gemm_nt_masked, a=a, b=b)
    d = poison(groups, max_m, n, dtype=torch.float32, device=device)
    m_grouped_fp8_fp4_gemm_nt_masked(prepared["a"], prepared["b"], d, masked_m.to(device), max(1, max_m // 2))
    ref = grouped_gemm_masked_reference(dequantize_reference(a).cpu().double(), dequantize_reference(b).cpu().double())
    valid = torch.arange(max_m)[None, :] < masked_m[:, None]
    return _check_rows(d.cpu(), ref, valid, 1e-6)


@conformance_cases("m_grouped_fp8_fp4_gemm_nt_contiguous")
def contiguous_cases(quick: bool) -> list[Case]:
    cases = []
    for i, (groups, n, k, fractions) in enumerate(QUICK_CONTIGUOUS if quick else FULL_CONTIGUOUS):
        for psum in (False, True):
            gran_k_a = 128 if psum else 32
            seed = 7800 + 10 * i + psum
            label = f"G={groups} n={n} k={k} counts={fractions} psum={psum} gran_k_a={gran_k_a}"
            cases.append(Case("m_grouped_fp8_fp4_gemm_nt_contiguous", label, seed,
                              functools.partial(_contiguous_case, groups, n, k, fractions, psum, gran_k_a, seed)))
    return cases


@conformance_cases("m_grouped_fp8_fp4_gemm_nt_masked")
def masked_cases(quick: bool) -> list[Case]:
    cases = []
    for i, (groups, max_m, n, k, given) in enumerate(QUICK_MASKED if quick else FULL_MASKED):
        seed = 7900 + 10 * i
        label = f"G={groups} max_m={max_m} n={n} k={k} masked_m={given}"
        cases.append(Case("m_grouped_fp8_fp4_gemm_nt_masked", label, seed,
                          functools.partial(_masked_case, groups, max_m, n, k, given, seed)))
    return cases
