"""CPU backend: the embedded default and the reference every other backend is checked against.

Its layout is the logical one (fp32 row-major scales), so preparing for it copies nothing.
"""

from __future__ import annotations

from typing import Any, Mapping

from portable_kernels.layout import Layout, plain_layout
from portable_kernels.registry import Backend, Registry
from portable_kernels.tensors import PreparedTensor, QuantTensor

from . import reference


class CpuBackend(Backend):
    name = "cpu"
    device_types = ("cpu",)

    def __init__(self) -> None:
        self._layout = plain_layout(self.name)

    def layout_for(self, op: str, arg: str, role: str, options: Mapping[str, Any]) -> Layout:
        return self._layout

    def decode(self, prepared: PreparedTensor) -> QuantTensor:
        return self._layout.decode(prepared)


def register(registry: Registry) -> None:
    """Entry point `portable_kernels.backends: cpu`."""
    registry.add_backend(CpuBackend())
    reference.register(registry)
