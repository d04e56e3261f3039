"""cpu provider "reference" for top-k selection: the contract's reference kernel (ties to the smaller index)."""

from __future__ import annotations

from portable_kernels.registry import Registry
from portable_kernels.topk import TOPK

from ._names import BACKEND, REFERENCE


def register(registry: Registry) -> None:
    registry.kernel(TOPK.name, BACKEND, REFERENCE)(TOPK.kernel)
