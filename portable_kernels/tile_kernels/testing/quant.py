"""`tile_kernels.testing.quant`: clear_unused_sf, which zeroes the padding bytes of packed UE8M0
scale words so two casts' scales can be compared byte for byte.

Packed scales hold four UE8M0 bytes per int32 word, so a row of S = ceil(hidden / num_per_channels)
scales takes align(S, 4) bytes and the last align(S, 4) - S are padding, e.g. S = 5:
    row bytes: s0 s1 s2 s3 | s4 .. .. ..   ->   s0 s1 s2 s3 | s4 00 00 00
"""

from __future__ import annotations

import torch

from ..utils import align, ceil_div

__all__ = ["clear_unused_sf"]

#: UE8M0 scale bytes per packed int32 word
SF_PER_WORD = 4


def clear_unused_sf(sf: torch.Tensor, hidden: int, num_per_channels: int) -> torch.Tensor:
    """uint8 [rows, align(S, 4)]: sf's bytes, one row per scale row, with the padding bytes past the
    S = ceil(hidden / num_per_channels) real scales set to zero. As TileKernels, a contiguous sf is
    cleared in place (the result is a view of it); any other sf is copied first."""
    num_blocks = ceil_div(hidden, num_per_channels)
    row_bytes = align(num_blocks, SF_PER_WORD)
    rows = sf.contiguous().flatten().view(torch.uint8).view(-1, row_bytes)
    rows[:, num_blocks:] = 0
    return rows
