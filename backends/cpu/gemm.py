"""cpu provider "reference" for the GEMM family: the contracts' reference kernels (the cpu layout
is the logical one, fp32 row-major scales, so they read its bytes directly)."""

from __future__ import annotations

from portable_kernels.ops.gemm.dense import BF16_GEMM_NT, FP8_GEMM_NT
from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    for contract in (FP8_GEMM_NT, BF16_GEMM_NT):
        register_reference(registry, BACKEND, contract)
