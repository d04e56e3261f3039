"""nvidia providers of the expert-parallel family: Triton get_dispatch_layout (the one EP op a rank
runs on its own tensors; dispatch / combine themselves stay with the layout oracle or DeepEP)."""

from __future__ import annotations

from portable_kernels.core.registry import Registry
from portable_kernels.ops.ep import GET_DISPATCH_LAYOUT

from ._common import BACKEND, TRITON, TRITON_PRIORITY, kernel, triton_devices, triton_reasons


def _layout(call):
    return kernel("ep_layout").get_dispatch_layout(call.topk_idx, call.num_experts, call.num_ranks)


def register(registry: Registry) -> None:
    registry.kernel(GET_DISPATCH_LAYOUT.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                    check=triton_reasons, doc="Triton, BLOCK_T tokens per program, integer atomic counts")(_layout)
