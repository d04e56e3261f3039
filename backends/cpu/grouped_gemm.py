"""cpu provider "reference" for the grouped GEMM family: dequantize (cpu layout: fp32 row-major
scales), run the contract's torch math, and write only the valid rows of d."""

from __future__ import annotations

import torch

from portable_kernels.grouped_gemm import (grouped_gemm_contiguous_reference, grouped_gemm_masked_reference,
                                           row_groups)
from portable_kernels.quantization import dequantize_reference
from portable_kernels.registry import Registry
from portable_kernels.tensors import QuantTensor

from ._names import BACKEND, REFERENCE


def _masked_rows(masked_m: torch.Tensor, max_m: int) -> torch.Tensor:
    return torch.arange(max_m, device=masked_m.device)[None, :] < masked_m[:, None]


def _contiguous(a, b, d, grouped_layout, use_psum_layout, alignment) -> None:
    if d.numel() == 0:
        return
    groups = row_groups(grouped_layout, use_psum_layout, alignment, d.shape[0])
    rows = groups >= 0
    d[rows] = grouped_gemm_contiguous_reference(a, b, groups)[rows].to(d.dtype)


def _masked(a, b, d, masked_m) -> None:
    if d.numel() == 0:
        return
    rows = _masked_rows(masked_m, d.shape[1])
    d[rows] = grouped_gemm_masked_reference(a, b)[rows].to(d.dtype)


def m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, d, grouped_layout, use_psum_layout, alignment, expected_m,
                                     sfa_format, sfb_format, sfa_granularity, sfb_granularity) -> None:
    da = dequantize_reference(QuantTensor(a, sfa, sfa_granularity))
    db = dequantize_reference(QuantTensor(b, sfb, sfb_granularity))
    _contiguous(da, db, d, grouped_layout, use_psum_layout, alignment)


def m_grouped_fp8_gemm_nt_masked(a, sfa, b, sfb, d, masked_m, expected_m, sfa_format, sfb_format,
                                 sfa_granularity, sfb_granularity) -> None:
    da = dequantize_reference(QuantTensor(a, sfa, sfa_granularity))
    db = dequantize_reference(QuantTensor(b, sfb, sfb_granularity))
    _masked(da, db, d, masked_m)


def m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, use_psum_layout, alignment, expected_m) -> None:
    _contiguous(a, b, d, grouped_layout, use_psum_layout, alignment)


def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m) -> None:
    _masked(a, b, d, masked_m)


def register(registry: Registry) -> None:
    for fn in (m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked,
               m_grouped_bf16_gemm_nt_contiguous, m_grouped_bf16_gemm_nt_masked):
        registry.kernel(fn.__name__, BACKEND, REFERENCE)(fn)
