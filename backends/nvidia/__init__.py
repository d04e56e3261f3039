"""nvidia backend: NVIDIA GPUs (Hopper sm90, Blackwell sm100).

First form: it declares its byte layouts (see formats.py; the architecture comes from the device's
compute capability, or from an explicit `arch=` when preparing) and registers, for every op, the
"layout-reference" oracle that decodes its own bytes and runs the contract math. That oracle is
not a performance path; real kernels (Triton, cuBLASLt, DeepGEMM delegation) register at higher
priority. On CPU tensors the backend runs in emulation when chosen explicitly.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from portable_kernels.errors import ContractError
from portable_kernels.layout import Layout
from portable_kernels.layouts import NVIDIA_MOE_ALIGNMENT
from portable_kernels.oracle import register_oracles
from portable_kernels.registry import Backend, Registry
from portable_kernels.tensors import PreparedTensor, QuantTensor

from .formats import ARCHS, BY_FORMAT, LAYOUTS, SM90, SM100

NAME = "nvidia"


def arch_of_capability(major: int, minor: int) -> str | None:
    """The layout family of a compute capability: 9.x -> sm90, 10.x -> sm100, else None."""
    return {9: SM90, 10: SM100}.get(major)


class NvidiaBackend(Backend):
    name = NAME
    device_types = ("cuda",)
    emulation = True
    moe_alignment = NVIDIA_MOE_ALIGNMENT

    def unavailable_reason(self) -> str | None:
        if not torch.cuda.is_available():
            return ("torch.cuda is not available (CPU-only torch build or no GPU); the nvidia backend runs in "
                    "emulation on CPU tensors only")
        return None

    def variants(self) -> list[dict[str, Any]]:
        return [{"arch": arch} for arch in ARCHS]

    def default_options(self, device: torch.device) -> dict[str, Any]:
        if device.type != "cuda":
            return {}
        arch = arch_of_capability(*torch.cuda.get_device_capability(device))
        return {"arch": arch} if arch else {}

    def layout_for(self, op: str, arg: str, role: str, options: Mapping[str, Any]) -> Layout:
        arch = options.get("arch", SM90)
        if arch not in LAYOUTS:
            raise ContractError(f"{op}: layout option arch={arch!r} is not one of {list(ARCHS)}. Fix: pass "
                                f"arch='sm90' (Hopper) or arch='sm100' (Blackwell), or run on the GPU itself.")
        return LAYOUTS[arch]

    def decode(self, prepared: PreparedTensor) -> QuantTensor:
        return BY_FORMAT[prepared.tag.format].decode(prepared)


def register(registry: Registry) -> None:
    """Entry point `portable_kernels.backends: nvidia`."""
    backend = NvidiaBackend()
    registry.add_backend(backend)
    register_oracles(registry, backend)
