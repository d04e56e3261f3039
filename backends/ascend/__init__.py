"""ascend backend: Huawei Ascend NPUs (Ascend 950 MX formats).

It stores quantized operands in `ASCEND_MX` (UE8M0 scales per (1, 32), two per int16, MN-major, no
padding; ND data) and the weights of the grouped MoE GEMMs in `ASCEND_MX_NZ` (the same scales,
FRACTAL_NZ data), with 256-row MoE segment alignment. For every op it registers the
"layout-reference" oracle that decodes its own bytes and runs the contract math — a correctness
tool, not a performance path. torch_npu operators and Ascend C kernels register later at higher
priority. Nothing here has run on a real NPU: without torch_npu the backend runs in emulation on
CPU tensors when chosen explicitly.
"""

from __future__ import annotations

from typing import Any, Mapping

from portable_kernels.layouts import ASCEND_MOE_ALIGNMENT, ASCEND_MX, ASCEND_MX_NZ

from portable_kernels.contract import QuantArg
from portable_kernels.formats import Format
from portable_kernels.oracle import register_oracles
from portable_kernels.registry import Backend, Registry

from . import runtime

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

    def format_for(self, op: str, arg: QuantArg, options: Mapping[str, Any]) -> Format:
        return ASCEND_MX_NZ if arg.role == "rhs" and op.startswith(NZ_WEIGHT_OP_PREFIX) else ASCEND_MX

    def formats(self) -> tuple[Format, ...]:
        return (ASCEND_MX, ASCEND_MX_NZ)


def register(registry: Registry) -> None:
    """Entry point `portable_kernels.backends: ascend`."""
    backend = AscendBackend()
    registry.add_backend(backend)
    register_oracles(registry, backend)
