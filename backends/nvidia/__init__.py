"""nvidia backend: NVIDIA GPUs (Hopper sm90, Blackwell sm100).

It stores quantized operands in the Format of the GPU architecture — `SM90` or `SM100` from
`portable_kernels.layouts` — taken from the device's compute capability, or from the `arch`
option (`use_backend("nvidia", arch="sm100")`, `prepare_inputs(..., arch=...)`). For every op it
registers the "layout-reference" oracle, which decodes those bytes and runs the contract math: a
correctness tool, not a performance path; real kernels (Triton, cuBLASLt, DeepGEMM delegation)
register at higher priority (providers/, one module per op family: the Triton kernels of kernels/,
the vendor calls of vendor/). On CPU tensors the backend runs in emulation when chosen explicitly;
its Triton kernels then run in Triton's interpreter when TRITON_INTERPRET=1 was set before the
first kernel call (see kernels/runtime.py), else the layout oracle answers.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from portable_kernels.layouts import NVIDIA_MOE_ALIGNMENT, SM90, SM100

from portable_kernels.core.contract import QuantArg
from portable_kernels.core.formats import Format
from portable_kernels.core.oracle import register_oracles
from portable_kernels.core.registry import Backend, Registry

NAME = "nvidia"
#: the architectures whose Formats this backend knows, and the Format each stores operands in
FORMATS = {"sm90": SM90, "sm100": SM100}
ARCHS = tuple(FORMATS)


def arch_of_capability(major: int, minor: int) -> str | None:
    """The layout family of a compute capability: 9.x -> sm90, 10.x -> sm100, else None."""
    return {9: "sm90", 10: "sm100"}.get(major)


class NvidiaBackend(Backend):
    name = NAME
    device_types = ("cuda",)
    emulation = True
    moe_alignment = NVIDIA_MOE_ALIGNMENT
    options = {"arch": ARCHS}

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

    def format_for(self, op: str, arg: QuantArg, options: Mapping[str, Any]) -> Format:
        return FORMATS[options.get("arch", "sm90")]

    def formats(self) -> tuple[Format, ...]:
        return tuple(FORMATS.values())


def register(registry: Registry) -> None:
    """Entry point `portable_kernels.backends: nvidia`."""
    backend = NvidiaBackend()
    registry.add_backend(backend)
    register_oracles(registry, backend)
    try:  # prepare_inputs on cuda tensors encodes SM90/SM100 scales with the CUDA C++ encoders
        from .cuda import register_encoders
        register_encoders()
    except Exception as exc:
        registry.record_broken(f"{NAME}.cuda_encoders", exc)
    from . import providers
    registry.register_modules(providers, NAME)
