"""cpu provider "reference" for block_cast (TileKernels' cast): the contract's reference kernel."""

from __future__ import annotations

from portable_kernels.ops.quant.block_cast import BLOCK_CAST
from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    register_reference(registry, BACKEND, BLOCK_CAST)
