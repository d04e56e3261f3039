"""DeepGEMM's runtime settings: the SM count it schedules for, and the architecture its layout
utilities target (here: the nvidia backend's `arch` — forced by use_backend, else the CUDA device's)."""

from __future__ import annotations

import os

import torch

from ..core.checks import check_int
from ..core.registry import forced_backend

_num_sms: int | None = None


def _device_sms() -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return os.cpu_count() or 1


def set_num_sms(new_num_sms: int) -> None:
    """Limit the SMs DeepGEMM's kernels may use (1..the device's count). Recorded and returned by
    get_num_sms; this library's kernels take no SM budget, so results never depend on it."""
    check_int("set_num_sms", "new_num_sms", new_num_sms, 1, _device_sms(),
              fix="pass a count between 1 and the device's SM count (get_num_sms() before any set)")
    global _num_sms
    _num_sms = new_num_sms


def get_num_sms() -> int:
    """The SM count set by set_num_sms, else the device's (the CUDA device's SMs; CPU cores here)."""
    return _device_sms() if _num_sms is None else _num_sms


def arch_major() -> int:
    """9 (SM90) or 10 (SM100): use_backend("nvidia", arch=...) if set, else the CUDA device's, else 9."""
    forced = forced_backend()
    if forced is not None and forced[0] == "nvidia" and "arch" in forced[1]:
        return 10 if forced[1]["arch"] == "sm100" else 9
    if torch.cuda.is_available():
        return 10 if torch.cuda.get_device_capability()[0] == 10 else 9
    return 9
