"""ascend backend: Huawei Ascend NPUs (Ascend 950 MX formats).

First form: it declares its byte layouts (formats.py: MX UE8M0 scales two per int16, MN-major, no
padding; FRACTAL_NZ weight data for the grouped MoE GEMMs; 256-row MoE segment alignment) and
registers, for every op, the "layout-reference" oracle that decodes its own bytes and runs the
contract math — a correctness tool, not a performance path. torch_npu operators and Ascend C
kernels register later at higher priority. Nothing here has run on a real NPU: without torch_npu
the backend runs in emulation on CPU tensors when chosen explicitly.
"""

from __future__ import annotations

from typing import Any, Mapping

from portable_kernels.layout import Layout
from portable_kernels.layouts import ASCEND_MOE_ALIGNMENT
from portable_kernels.oracle import register_oracles
from portable_kernels.registry import Backend, Registry
from portable_kernels.tensors import PreparedTensor, QuantTensor

from . import runtime
from .formats import BY_FORMAT, MX, MX_NZ

NAME = "ascend"
#: ops whose weight operand the ascend backend stores as FRACTAL_NZ tiles
NZ_WEIGHT_OP_PREFIX = "m_grouped_"


class AscendBackend(Backend):
    name = NAME
    device_types = ("npu",)
    emulation = True
    moe_alignment = ASCEND_MOE_ALIGNMENT

    def unavailable_reason(self) -> str | None:
        return runtime.unavailable_reason()

    def layout_for(self, op: str, arg: str, role: str, options: Mapping[str, Any]) -> Layout:
        return MX_NZ if role == "rhs" and op.startswith(NZ_WEIGHT_OP_PREFIX) else MX

    def decode(self, prepared: PreparedTensor) -> QuantTensor:
        return BY_FORMAT[prepared.tag.format].decode(prepared)


def register(registry: Registry) -> None:
    """Entry point `portable_kernels.backends: ascend`."""
    backend = AscendBackend()
    registry.add_backend(backend)
    register_oracles(registry, backend)
