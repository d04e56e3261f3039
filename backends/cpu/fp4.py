"""cpu provider "reference" for the FP4 family and the fused SwiGLU quantizer: the contracts'
reference kernels (cpu layout: fp32 row-major scales, packed E2M1 bytes as they are)."""

from __future__ import annotations

from portable_kernels.ops.quant.fp4 import FP8_FP4_GEMM_NT, PER_TOKEN_CAST_FP4, SWIGLU_CAST
from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    for contract in (PER_TOKEN_CAST_FP4, FP8_FP4_GEMM_NT, SWIGLU_CAST):
        register_reference(registry, BACKEND, contract)
