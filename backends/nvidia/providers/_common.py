"""Names, priorities and checks the nvidia provider modules share.

Priorities (higher runs first; the order is a default until the H200 device check measures it —
benchmarks/device_check_nvidia.py prints per-shape timings of every provider side by side):
hand-tuned vendor libraries (DeepGEMM, FlashMLA, DeepSelect) 30 when installed, the Triton
kernels 20, torch's vendor ops (torch._scaled_mm / torch._grouped_mm) 10, the layout oracle -100.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from portable_kernels.layouts import PLAIN, SM90, SM100

from ..kernels import runtime

BACKEND = "nvidia"
TRITON = "triton"
LIBRARY_PRIORITY = 30
TRITON_PRIORITY = 20
TORCH_VENDOR_PRIORITY = 10
#: the formats the Triton kernels read and write (and the quantizers' scale form for each)
NVIDIA_FORMATS = (SM90, SM100)
SCALE_FORM = {PLAIN: "plain", SM90: "sm90", SM100: "sm100"}


def triton_devices() -> tuple[str, ...]:
    """cuda, plus cpu when the kernels run (or will run) in Triton's interpreter (emulation)."""
    return ("cuda", "cpu") if runtime.current_mode() == "interpreter" else ("cuda",)


def triton_reasons(inputs: Any) -> list[str]:
    """Why the Triton kernels cannot run this call's device here (triton missing, wrong mode)."""
    reason = runtime.device_reason(inputs.device)
    return [] if reason is None else [reason]


def kernel(name: str) -> ModuleType:
    """A kernel module of ../kernels, imported on first use (importing it imports Triton)."""
    return importlib.import_module(f"portable_kernels.backends.nvidia.kernels.{name}")


def storage_granularity(operand: Any) -> tuple[int, int] | None:
    return tuple(operand.storage_granularity) if hasattr(operand, "storage_granularity") else None
