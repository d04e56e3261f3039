"""cpu provider "reference" for top-k selection: the contract's reference kernel (ties to the smaller index)."""

from __future__ import annotations

from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry
from portable_kernels.ops.topk import TOPK

from ._names import BACKEND


def register(registry: Registry) -> None:
    register_reference(registry, BACKEND, TOPK)
