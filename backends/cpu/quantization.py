"""cpu provider "reference" for the FP8 quantizers: the contracts' reference kernels."""

from __future__ import annotations

from portable_kernels.core.oracle import register_reference
from portable_kernels.ops.quant.fp8 import PER_BLOCK_CAST, PER_CHANNEL_CAST, PER_TOKEN_CAST
from portable_kernels.core.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    for contract in (PER_TOKEN_CAST, PER_BLOCK_CAST, PER_CHANNEL_CAST):
        register_reference(registry, BACKEND, contract)
