"""The MoE contiguous layout's row alignment (settable, as DeepGEMM's) and its padding rows.

Every expert segment of a contiguous grouped-GEMM operand starts on a multiple of the alignment.
By default that is the backend's own (`Backend.moe_alignment`: 128 on NVIDIA and cpu, 256 on
Ascend); `set_mk_alignment_for_contiguous_layout(n)` sets one value for the whole process (DeepGEMM
sets 224 on SM100 for its block size), and every op that builds or reads the layout — the
contiguous grouped GEMMs, `get_fused_mapping`'s default, `get_m_alignment_for_contiguous_layout` —
then uses it. `padding_rows` finds the rows of either form that belong to no group with device ops
only (no host sync), so an op can zero them after any provider ran.
"""

from __future__ import annotations

import threading

import torch

from .checks import check_int
from .registry import Backend

_lock = threading.Lock()
_override: int | None = None


def set_mk_alignment_for_contiguous_layout(alignment: int | None) -> None:
    """Set the row alignment of every expert segment in the contiguous layout, for the whole process
    (DeepGEMM's function of the same name). None restores each backend's own alignment.

    Build m_indices / psum layouts with the value `get_m_alignment_for_contiguous_layout()` returns
    after this call; the grouped GEMMs read layouts with it and refuse m_indices that do not fit it.
    """
    if alignment is not None:
        check_int("set_mk_alignment_for_contiguous_layout", "alignment", alignment, 1,
                  fix="pass a positive row count such as 128 (DeepGEMM uses 224 on SM100), or None to reset")
    global _override
    with _lock:
        _override = alignment


def alignment_override() -> int | None:
    """The alignment set by set_mk_alignment_for_contiguous_layout, or None (each backend's own)."""
    return _override


def contiguous_alignment(backend: Backend) -> int:
    """The alignment a contiguous layout has on `backend`: the process-wide setting, else its own."""
    override = _override
    return backend.moe_alignment if override is None else override


def padding_rows(grouped_layout: torch.Tensor, use_psum_layout: bool, alignment: int, total_m: int) -> torch.Tensor:
    """bool [total_m]: True on rows that belong to no group — m_indices -1, or in the psum form the
    gaps [psum[g-1], align(psum[g-1], alignment)) and every row from psum[-1] on. Device ops only."""
    if not use_psum_layout:
        return grouped_layout < 0
    ends = grouped_layout.to(torch.int64)
    if ends.numel() == 0:
        return torch.ones(total_m, dtype=torch.bool, device=grouped_layout.device)
    previous = torch.cat((ends.new_zeros(1), ends[:-1]))
    starts = (previous + alignment - 1) // alignment * alignment
    rows = torch.arange(total_m, device=grouped_layout.device)
    group = torch.searchsorted(ends, rows, right=True)   # the first group whose end lies past the row
    inside = (group < ends.numel()) & (rows >= starts[group.clamp(max=ends.numel() - 1)])
    return ~inside
