"""torch._grouped_mm for the bf16 grouped GEMMs (CUTLASS on Hopper; torch has a CPU fallback).

What torch checks (aten/src/ATen/native/GroupedMMUtils.h): mat_a bf16 [M, K] (2-D, with `offs`)
or [G, M, K] (3-D, batched); mat_b bf16 [G, K, N] 3-D; each matrix row- or column-major with
16-byte aligned strides and data; offs int32 [G] = cumulative END row of each group in mat_a;
the output dtype is mat_a's (bf16) and the output is a new tensor.

Mapping: the contiguous layout's segments become groups [start_g, end_g) with offs = the aligned
segment ends (computed on the device from m_indices or psum, no host sync); the masked form is a
batched product. _grouped_mm computes every row of a segment, padding included, so the result is
merged into d only where a row is valid (d keeps its padding rows, as the contract says): one
pass over d more than a kernel that skips them. d must be bf16.
"""

from __future__ import annotations

import attrs
import torch

#: bf16 elements per 16 bytes: K and N must be multiples of it for aligned strides
ALIGN_ELEMENTS = 8


@attrs.frozen
class GroupedMmCall:
    mat_a: torch.Tensor
    mat_b: torch.Tensor
    offs: torch.Tensor | None
    valid_rows: torch.Tensor  # bool, [M] (contiguous) or [G, max_m] (masked)


def reasons(k: int, n: int, d_dtype: torch.dtype) -> list[str]:
    out = []
    if k % ALIGN_ELEMENTS or n % ALIGN_ELEMENTS:
        out.append(f"K = {k} and N = {n} must be multiples of {ALIGN_ELEMENTS} (16-byte aligned bf16 strides)")
    if d_dtype != torch.bfloat16:
        out.append(f"torch._grouped_mm returns bf16 like its inputs; d is {d_dtype}")
    return out


def device_reasons(device: torch.device) -> list[str]:
    if not hasattr(torch, "_grouped_mm"):
        return ["this torch has no _grouped_mm"]
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 9:
        return ["torch._grouped_mm needs compute capability >= 9.0"]
    return []


def contiguous_rows(grouped_layout: torch.Tensor, use_psum_layout: bool, alignment: int, num_groups: int,
                    total_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(offs int32 [G] = each segment's aligned end row, valid bool [M]) on the layout's device, by
    tensor ops only (no host sync). A psum layout's last segment ends at align(psum[-1])."""
    device = grouped_layout.device
    rows = torch.arange(total_m, device=device)
    if use_psum_layout:
        ends = grouped_layout.to(torch.int64)
        starts = torch.cat((ends.new_zeros(1), (ends[:-1] + alignment - 1) // alignment * alignment))
        group = torch.searchsorted(starts, rows, right=True) - 1
        valid = rows < ends[group.clamp(min=0)]
        offs = (ends + alignment - 1) // alignment * alignment
        offs = torch.minimum(offs, torch.full_like(offs, total_m))
    else:
        m = grouped_layout.to(torch.int64)
        valid = m >= 0
        counts = torch.zeros(num_groups, dtype=torch.int64, device=device)
        counts.scatter_add_(0, m.clamp(min=0), valid.to(torch.int64))
        offs = torch.cumsum((counts + alignment - 1) // alignment * alignment, 0)
        offs = torch.minimum(offs, torch.full_like(offs, total_m))
    return offs.to(torch.int32), valid


def contiguous_call(a: torch.Tensor, b: torch.Tensor, grouped_layout: torch.Tensor, use_psum_layout: bool,
                    alignment: int) -> GroupedMmCall:
    """a bf16 [M, K], b bf16 [G, N, K] -> _grouped_mm(a, b.mT, offs) and the rows to keep."""
    offs, valid = contiguous_rows(grouped_layout, use_psum_layout, alignment, b.shape[0], a.shape[0])
    return GroupedMmCall(a, b.transpose(1, 2), offs, valid)


def masked_call(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor) -> GroupedMmCall:
    """a bf16 [G, max_m, K], b bf16 [G, N, K] -> batched _grouped_mm(a, b.mT) and the rows to keep."""
    rows = torch.arange(a.shape[1], device=a.device)
    return GroupedMmCall(a, b.transpose(1, 2), None, rows[None, :] < masked_m.to(torch.int64)[:, None])


def run(call: GroupedMmCall, d: torch.Tensor) -> None:
    """Compute with torch._grouped_mm and write the valid rows of d (the others keep their bytes)."""
    product = torch._grouped_mm(call.mat_a, call.mat_b, offs=call.offs)
    torch.where(call.valid_rows[..., None], product, d, out=d)
