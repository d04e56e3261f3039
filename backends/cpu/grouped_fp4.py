"""cpu provider "reference" for the grouped FP8 x FP4 GEMMs: the grouped contracts' reference kernels
(they dequantize the packed E2M1 weights; valid rows only)."""

from __future__ import annotations

from portable_kernels.ops.gemm.grouped_fp4 import M_GROUPED_FP8_FP4_CONTIGUOUS, M_GROUPED_FP8_FP4_MASKED
from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    for contract in (M_GROUPED_FP8_FP4_CONTIGUOUS, M_GROUPED_FP8_FP4_MASKED):
        register_reference(registry, BACKEND, contract)
