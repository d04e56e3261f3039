"""cpu provider "reference" for the GEMM family: dequantize (cpu layout: fp32 row-major scales),
then the contract's torch math, written into d."""

from __future__ import annotations

from portable_kernels.gemm import gemm_reference
from portable_kernels.quantization import dequantize_reference
from portable_kernels.registry import Registry
from portable_kernels.tensors import QuantTensor

from ._names import BACKEND, REFERENCE


def fp8_gemm_nt(a, sfa, b, sfb, d, c, sfa_format, sfb_format, sfa_granularity, sfb_granularity) -> None:
    if d.numel() == 0:
        return
    da = dequantize_reference(QuantTensor(a, sfa, sfa_granularity))
    db = dequantize_reference(QuantTensor(b, sfb, sfb_granularity))
    d.copy_(gemm_reference(da, db, c))


def bf16_gemm_nt(a, b, d, c) -> None:
    if d.numel() == 0:
        return
    d.copy_(gemm_reference(a, b, c))


def register(registry: Registry) -> None:
    registry.kernel("fp8_gemm_nt", BACKEND, REFERENCE)(fp8_gemm_nt)
    registry.kernel("bf16_gemm_nt", BACKEND, REFERENCE)(bf16_gemm_nt)
