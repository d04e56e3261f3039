"""TileKernels' SM-count setting (`tile_kernels.config`): what its kernels size persistent grids by.

`get_device_num_sms()` is the current CUDA device's multiprocessor count, or on a machine without
CUDA the nominal count of the emulated NVIDIA architecture (132 for SM90, 148 for SM100 under
`use_backend("nvidia", arch="sm100")`; see `portable_kernels.core.device_sms`), so upstream code
such as `set_num_sms(get_device_num_sms() - 20)` runs as on that GPU. `set_num_sms(n)` stores a
budget (0 < n <= the device count) that `get_num_sms()` then returns. The portable ops choose their
own launch sizes, so the setting is kept for code that reads it back (as TileKernels' tests do).
"""

from __future__ import annotations

from ..core.checks import check_int
from ..core.device_sms import device_num_sms

_num_sms = 0


def get_device_num_sms() -> int:
    """Multiprocessors of the current CUDA device; without one, the emulated architecture's nominal count.

    Not cached (TileKernels caches it): the emulated architecture can change with use_backend.
    """
    return device_num_sms()


def set_num_sms(num_sms: int) -> None:
    """Limit the SM budget to num_sms (0 < num_sms <= get_device_num_sms())."""
    global _num_sms
    count = get_device_num_sms()
    check_int("set_num_sms", "num_sms", num_sms, 1, count, f"pass 1..{count} (the device's count)")
    _num_sms = num_sms


def get_num_sms() -> int:
    """The budget set by set_num_sms, else the device's count."""
    return _num_sms or get_device_num_sms()
