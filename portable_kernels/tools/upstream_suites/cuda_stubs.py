"""torch.cuda calls with no CPU meaning, made harmless for upstream tests run on a CPU.

Only calls that neither compute nor decide anything are stubbed (synchronize, memory statistics,
cache release, CUDA seeding); anything that needs a real device stays as it is and fails honestly.
"""

from __future__ import annotations

import torch

#: name -> the value the stub returns
STUBBED = {
    "synchronize": None,
    "empty_cache": None,
    "manual_seed": None,
    "manual_seed_all": None,
    "set_device": None,
    "reset_peak_memory_stats": None,
    "max_memory_allocated": 0,
    "max_memory_reserved": 0,
    "memory_allocated": 0,
    "memory_reserved": 0,
}


def install() -> None:
    """Replace the STUBBED torch.cuda functions when there is no CUDA device."""
    if torch.cuda.is_available():
        return
    for name, value in STUBBED.items():
        setattr(torch.cuda, name, lambda *args, _value=value, **kwargs: _value)
