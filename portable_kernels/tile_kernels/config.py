"""TileKernels' SM-count setting (`tile_kernels.config`): what its kernels size persistent grids by.

`get_device_num_sms()` is the current CUDA device's multiprocessor count, or on a machine without
CUDA the CPU count (the parallelism the host kernels use); `set_num_sms(n)` stores a smaller budget
(0 < n <= the device count) that `get_num_sms()` then returns. The portable ops choose their own
launch sizes, so the setting is kept for code that reads it back (as TileKernels' tests do).
"""

from __future__ import annotations

import functools
import os

import torch

from ..core.checks import check_int

_num_sms = 0


@functools.lru_cache(maxsize=None)
def get_device_num_sms() -> int:
    """Multiprocessors of the current CUDA device; the CPU count where there is no CUDA device."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return os.cpu_count() or 1


def set_num_sms(num_sms: int) -> None:
    """Limit the SM budget to num_sms (0 < num_sms <= get_device_num_sms())."""
    global _num_sms
    check_int("set_num_sms", "num_sms", num_sms, 1, get_device_num_sms(),
              f"pass 1..{get_device_num_sms()} (the device's count)")
    _num_sms = num_sms


def get_num_sms() -> int:
    """The budget set by set_num_sms, else the device's count."""
    return _num_sms or get_device_num_sms()
