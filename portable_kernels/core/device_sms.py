"""The SM count the drop-ins' runtime settings report: the CUDA device's multiprocessor count, or
without a CUDA device the nominal count of the NVIDIA architecture being emulated.

One rule: the emulated architecture is the nvidia backend's `arch` when use_backend forces it, else
the CUDA device's, else SM90 — so upstream code such as `set_num_sms(get_device_num_sms() - 20)`
behaves on a CPU as it would on that GPU. This library's kernels size their own launches; no
result depends on the count.
"""

from __future__ import annotations

import torch

from .registry import forced_backend

#: SMs of the reference GPU of each architecture major (H800 / H100 SXM: 132; B200: 148)
NOMINAL_SMS = {9: 132, 10: 148}
#: the architecture emulated when nothing names one (SM90, as DeepGEMM's and TileKernels' first target)
DEFAULT_ARCH_MAJOR = 9


def emulated_arch_major() -> int:
    """9 (SM90) or 10 (SM100): use_backend("nvidia", arch=...) if set, else the CUDA device's, else 9."""
    forced = forced_backend()
    if forced is not None and forced[0] == "nvidia" and "arch" in forced[1]:
        return 10 if forced[1]["arch"] == "sm100" else 9
    if torch.cuda.is_available():
        return 10 if torch.cuda.get_device_capability()[0] == 10 else 9
    return DEFAULT_ARCH_MAJOR


def device_num_sms() -> int:
    """The current CUDA device's multiprocessor count; without one, NOMINAL_SMS of the emulated architecture."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return NOMINAL_SMS[emulated_arch_major()]
