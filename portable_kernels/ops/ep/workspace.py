"""Scratch memory a Buffer reuses between calls (send staging, receive areas, accumulators).

Only tensors that never leave the Buffer live here — what a call returns is always freshly
allocated and owned by the caller. Reuse matters on CPU, where every fresh large allocation
costs page faults (a cost a GPU's caching allocator hides); on a device the reuse is ordered by
the stream the Buffer runs on.
"""

from __future__ import annotations

import math

import torch


class Workspace:
    """Named uint8 areas, grown on demand, handed out as typed views."""

    def __init__(self) -> None:
        self._areas: dict[str, torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A [*shape] tensor of dtype over area `name` (its contents are whatever the last user left)."""
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        area = self._areas.get(name)
        if area is None or area.device != device or area.numel() < nbytes:
            area = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
            self._areas[name] = area
        return area[:nbytes].view(dtype).view(shape)

    def nbytes(self) -> int:
        return sum(a.numel() for a in self._areas.values())

    def clear(self) -> None:
        self._areas.clear()
