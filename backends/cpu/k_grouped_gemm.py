"""cpu provider "reference" for the K-grouped GEMMs: the contracts' reference kernel (group by group
on dequantized operands)."""

from __future__ import annotations

from portable_kernels.ops.gemm.k_grouped import K_GROUPED_BF16_TN, K_GROUPED_FP8_NT, K_GROUPED_FP8_TN
from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    for contract in (K_GROUPED_FP8_TN, K_GROUPED_FP8_NT, K_GROUPED_BF16_TN):
        register_reference(registry, BACKEND, contract)
