"""MoE grouped-GEMM row layouts (DeepGEMM names): contiguous `m_indices`, psum, masked.

Rule: every form is derived from the per-group token counts, so all three convert into each other
exactly; bad counts or indices raise LayoutConversionError.

Contiguous: the tokens of each expert are concatenated and each segment is padded up to the
alignment (128 on NVIDIA, 256 on Ascend). `m_indices` [M_total] int32 gives each row's group, -1 on
padding rows. Example counts [3, 0, 5], alignment 4::

    row        0  1  2  3 | 4  5  6  7  8  9  10 11
    m_indices  0  0  0 -1 | 2  2  2  2  2 -1  -1 -1        (group 1 has no rows)

Psum form (Ascend grouped_layout): psum[g] = align(psum[g-1], alignment) + count[g] (psum[-1] = 0),
the END row of group g, which occupies [align(psum[g-1], alignment), psum[g]). For the example:
psum = [3, 4, 9] (the empty group 1 is [4, 4)). The last group's trailing padding is NOT included:
the tensor needs align(psum[-1], alignment) rows (12 here).

Masked: A [G, max_m, K] with `masked_m` [G] int32 valid rows per group (every count <= max_m);
its scales [G, max_m, ceil(K/128)] are TMA-aligned per group on NVIDIA, which is exactly
`sm90_sfa_encode` of the grouped scales (stride(-3) = align(max_m, 4) * ceil(K/128)).
"""

from __future__ import annotations

import torch

from ._util import require_positive_int
from .errors import LayoutConversionError

__all__ = [
    "aligned_counts",
    "contiguous_total_m",
    "segment_starts",
    "contiguous_m_indices",
    "counts_from_m_indices",
    "psum_layout",
    "counts_from_psum",
    "m_indices_from_psum",
    "masked_m_from_counts",
    "check_masked_m",
]

_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def _int_vector(name: str, t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype not in _INT_DTYPES or t.dim() != 1:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise LayoutConversionError(f"{name} must be a 1-D integer tensor, got {got}")
    return t.to(torch.int64)


def _counts(counts: torch.Tensor) -> torch.Tensor:
    c = _int_vector("counts", counts)
    if bool((c < 0).any()):
        raise LayoutConversionError(f"counts must be >= 0, got {counts.tolist()}")
    return c


def aligned_counts(counts: torch.Tensor, alignment: int) -> torch.Tensor:
    """Rows each group occupies in the contiguous layout: align(count, alignment), int64 [G]."""
    require_positive_int("alignment", alignment)
    c = _counts(counts)
    return (c + alignment - 1) // alignment * alignment


def contiguous_total_m(counts: torch.Tensor, alignment: int) -> int:
    """M_total of the contiguous layout: sum of aligned counts (counts [3, 0, 5], alignment 4 -> 12)."""
    return int(aligned_counts(counts, alignment).sum())


def segment_starts(counts: torch.Tensor, alignment: int) -> torch.Tensor:
    """First row of each group's segment, int32 [G] (counts [3, 0, 5], alignment 4 -> [0, 4, 4])."""
    a = aligned_counts(counts, alignment)
    return (torch.cumsum(a, 0) - a).to(torch.int32)


def contiguous_m_indices(counts: torch.Tensor, alignment: int) -> torch.Tensor:
    """Group id of every row of the contiguous layout, -1 on padding rows: int32 [M_total].

    counts [3, 0, 5], alignment 4 -> [0, 0, 0, -1, 2, 2, 2, 2, 2, -1, -1, -1].
    """
    c = _counts(counts)
    a = aligned_counts(counts, alignment)
    starts = torch.cumsum(a, 0) - a
    group = torch.repeat_interleave(torch.arange(c.numel(), device=c.device), a)
    offset = torch.arange(group.numel(), device=c.device) - starts[group]
    return torch.where(offset < c[group], group, -1).to(torch.int32)


def counts_from_m_indices(m_indices: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Rows per group (int32 [G]) counted from `m_indices`; -1 rows are padding and not counted."""
    require_positive_int("num_groups", num_groups)
    m = _int_vector("m_indices", m_indices)
    if bool(((m < -1) | (m >= num_groups)).any()):
        raise LayoutConversionError(
            f"m_indices values must be -1 or in [0, {num_groups}), got min {int(m.min())}, max {int(m.max())}"
        )
    return torch.bincount(m[m >= 0], minlength=num_groups).to(torch.int32)


def psum_layout(counts: torch.Tensor, alignment: int) -> torch.Tensor:
    """Cumulative END rows, int32 [G]: psum[g] = align(psum[g-1], alignment) + count[g], psum[-1] = 0.

    Group g occupies rows [align(psum[g-1], alignment), psum[g]); the last group's trailing
    alignment is not included. counts [3, 0, 5], alignment 4 -> [3, 4, 9]; alignment 256 with
    counts [300, 10] -> [300, 522].
    """
    c = _counts(counts)
    return (segment_starts(counts, alignment).to(torch.int64) + c).to(torch.int32)


def counts_from_psum(psum: torch.Tensor, alignment: int) -> torch.Tensor:
    """Inverse of `psum_layout`: count[g] = psum[g] - align(psum[g-1], alignment), int32 [G]."""
    require_positive_int("alignment", alignment)
    p = _int_vector("psum", psum)
    prev = torch.cat((p.new_zeros(1), p[:-1]))
    counts = p - (prev + alignment - 1) // alignment * alignment
    if bool((counts < 0).any()):
        raise LayoutConversionError(
            f"psum {psum.tolist()} is not a valid psum layout for alignment {alignment}: each entry must be "
            "at least the previous one rounded up to the alignment"
        )
    return counts.to(torch.int32)


def m_indices_from_psum(psum: torch.Tensor, alignment: int, total_m: int) -> torch.Tensor:
    """`m_indices` int32 [total_m] of the rows described by `psum`; rows past the last group are -1.

    total_m must be at least psum[-1] (the tensor may have more rows, e.g. align(psum[-1], alignment)).
    """
    counts = counts_from_psum(psum, alignment)
    if isinstance(total_m, bool) or not isinstance(total_m, int) or total_m < 0:
        raise LayoutConversionError(f"total_m must be an int >= 0, got {total_m!r}")
    last = int(psum[-1]) if psum.numel() else 0
    if total_m < last:
        raise LayoutConversionError(f"total_m={total_m} is smaller than the last psum row {last}")
    rows = contiguous_m_indices(counts, alignment)[:total_m]
    out = torch.full((total_m,), -1, dtype=torch.int32, device=rows.device)
    out[: rows.numel()] = rows
    return out


def masked_m_from_counts(counts: torch.Tensor) -> torch.Tensor:
    """`masked_m` int32 [G] for the masked layout: the valid rows of each group (the counts themselves)."""
    return _counts(counts).to(torch.int32)


def check_masked_m(masked_m: torch.Tensor, max_m: int) -> None:
    """Raise LayoutConversionError unless 0 <= masked_m[g] <= max_m for every group (A is [G, max_m, K])."""
    require_positive_int("max_m", max_m)
    m = _int_vector("masked_m", masked_m)
    if bool(((m < 0) | (m > max_m)).any()):
        raise LayoutConversionError(
            f"masked_m must lie in [0, max_m={max_m}], got max {int(m.max())}, min {int(m.min())}; "
            "allocate A with max_m >= the largest group"
        )
