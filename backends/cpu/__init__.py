"""CPU backend: the embedded default and the reference every other backend is checked against.

It stores quantized operands in the PLAIN Format (the logical one: fp32 row-major scales), so
preparing for it copies nothing. Every contract's reference kernel is its provider "reference";
providers/ holds one module per op family with a `register(registry)` function (the native C++
kernels of kernels/, the EP simulation), each registered on its own (no central list to edit).
"""

from __future__ import annotations

from portable_kernels.core.oracle import register_references
from portable_kernels.core.registry import Backend, Registry

from . import providers
from ._names import BACKEND


class CpuBackend(Backend):
    name = BACKEND
    device_types = ("cpu",)


def register(registry: Registry) -> None:
    """Entry point `portable_kernels.backends: cpu`."""
    registry.add_backend(CpuBackend())
    register_references(registry, BACKEND)
    registry.register_modules(providers, BACKEND)
