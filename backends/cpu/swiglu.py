"""cpu provider "reference" for swiglu_forward (SwiGLU in fp32, no cast): the contract's reference kernel."""

from __future__ import annotations

from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry
from portable_kernels.ops.swiglu import SWIGLU_FORWARD

from ._names import BACKEND


def register(registry: Registry) -> None:
    register_reference(registry, BACKEND, SWIGLU_FORWARD)
