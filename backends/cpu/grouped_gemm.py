"""cpu provider "reference" for the grouped GEMM family: the contracts' reference kernels (the cpu
layout is the logical one), which write only the valid rows of d."""

from __future__ import annotations

from portable_kernels.ops.gemm.grouped import (M_GROUPED_BF16_CONTIGUOUS, M_GROUPED_BF16_MASKED, M_GROUPED_FP8_CONTIGUOUS,
                                           M_GROUPED_FP8_MASKED)
from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    for contract in (M_GROUPED_FP8_CONTIGUOUS, M_GROUPED_FP8_MASKED, M_GROUPED_BF16_CONTIGUOUS,
                     M_GROUPED_BF16_MASKED):
        register_reference(registry, BACKEND, contract)
