"""Grouped (MoE) GEMM providers over `npu_grouped_matmul` (docs/ascend.md, *Grouped GEMM*).

The CANN op takes one x [M, K], one weight [G, K, N] and a `group_list` that splits x's rows into G
consecutive runs (group_list_type 0 = cumulative ends, used here because it also allows G = 1, which
type 1 = counts does not). The providers always end the last group at M, which every doc accepts
(the torch_npu page asks for the last value = M; aclnnGroupedMatmulV5 allows <= M, rows past it not
updated); at most 1024 groups on Atlas A2/A3 (no bound documented for the 950: `limits.UNBOUNDED`).
The DeepGEMM layouts map onto that without moving rows:

- contiguous `m_indices` (ascending runs, -1 on padding rows): each padding row is folded into the
  group of the valid rows before it (a running max of the row's group ids), so the counts sum to M;
- psum `grouped_layout` (Ascend's native form): cumulative ends `align(psum[g], alignment)`, last = M;
- masked [G, max_m, K]: every group is `max_m` rows of the flattened [G·max_m, K] x.

Rows that are padding (or past masked_m[g]) are computed by the op and then not written to d (a
`torch.where` over the output), which keeps the contract's "padding rows of d are untouched". Every
step runs on the device: nothing is read back to the host.
"""

from __future__ import annotations

from typing import Any

import torch

#: group_list_type 0: the values are cumulative row ends (torch_npu docs)
CUMULATIVE = 0


def contiguous_group_ends(m_indices: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cumulative ends int64 [G], last = M; valid-row mask [M]) for the contiguous layout.

    Leading padding rows (before any group) join group 0. Example m_indices [0, 0, -1, 2, -1, -1]
    with G = 3 -> filled [0, 0, 0, 2, 2, 2] -> counts [3, 0, 3] -> ends [3, 3, 6].
    """
    valid = m_indices >= 0
    filled = torch.cummax(m_indices.long(), dim=0).values.clamp_min(0) if m_indices.numel() else m_indices.long()
    return torch.cumsum(torch.bincount(filled, minlength=num_groups), 0), valid


def psum_group_ends(psum: torch.Tensor, alignment: int, total_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cumulative ends int64 [G], valid-row mask [total_m]) for the psum layout.

    Group g holds rows [align(psum[g-1]), psum[g]); its trailing alignment rows are folded into it,
    and the last group runs to total_m. Example psum [3, 4, 9], alignment 4, M = 12 -> ends [4, 4, 12]
    (group 1 is empty).
    """
    p = psum.long()
    ends = (p + alignment - 1) // alignment * alignment
    ends[-1] = total_m
    starts = torch.cat((p.new_zeros(1), ends[:-1]))
    row = torch.arange(total_m, device=p.device)
    group = torch.searchsorted(ends, row, right=True).clamp_max(p.numel() - 1)
    valid = (row >= starts[group]) & (row < p[group])
    return ends, valid


def _write_rows(out: torch.Tensor, d: torch.Tensor, valid: torch.Tensor) -> None:
    d.copy_(torch.where(valid[:, None], out.to(d.dtype), d))


def bf16_grouped_gemm(npu: Any, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, group_ends: torch.Tensor,
                      valid: torch.Tensor) -> None:
    """a bf16 [M, K], b bf16 [G, N, K] (handed over as the [G, K, N] transposed view), d [M, N]."""
    if d.numel() == 0:
        return
    out = npu.npu_grouped_matmul([a], [b.transpose(1, 2)], group_list=group_ends, split_item=3, group_type=0,
                                 group_list_type=CUMULATIVE, output_dtype=torch.bfloat16)[0]
    _write_rows(out, d, valid)


def mx_grouped_gemm(npu: Any, a: torch.Tensor, sfa_pairs: torch.Tensor, b: torch.Tensor, sfb_pairs: torch.Tensor,
                    d: torch.Tensor, group_ends: torch.Tensor, valid: torch.Tensor) -> None:
    """Ascend 950 MX: a e4m3 [M, K] with K-major pairs [M, ceil(K/64), 2]; b e4m3 [G, N, K] with pairs
    [G, N, ceil(K/64), 2]; both weight tensors handed over as transposed views (MindSpeed's call form);
    d bf16 or fp32 (aclnnGroupedMatmulV5, Ascend 950 动态量化（MX）: out BFLOAT16/FLOAT16/FLOAT32)."""
    if d.numel() == 0:
        return
    out = npu.npu_grouped_matmul(
        [a], [b.transpose(1, 2)], scale=[sfb_pairs.view(torch.uint8).transpose(1, 2)],
        per_token_scale=[sfa_pairs.view(torch.uint8)], group_list=group_ends, split_item=3, group_type=0,
        group_list_type=CUMULATIVE, output_dtype=d.dtype, scale_dtype=npu.float8_e8m0fnu,
        per_token_scale_dtype=npu.float8_e8m0fnu)[0]
    _write_rows(out, d, valid)


def masked_group_ends(masked_m: torch.Tensor, max_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cumulative ends int64 [G] = max_m, 2·max_m, ...; valid-row mask [G·max_m]) for the masked layout."""
    g = masked_m.shape[0]
    ends = torch.arange(1, g + 1, dtype=torch.int64, device=masked_m.device) * max_m
    valid = (torch.arange(max_m, device=masked_m.device)[None, :] < masked_m[:, None]).flatten()
    return ends, valid


def dequantized_grouped_gemm(npu: Any, a_values: torch.Tensor, b_values: torch.Tensor, d: torch.Tensor,
                             group_ends: torch.Tensor, valid: torch.Tensor) -> None:
    """Atlas A2/A3: activation and weight values (both bf16, or both fp32 — exact either way) through
    npu_grouped_matmul's non-quantized form (fp32 x fp32 -> fp32 is documented for one x / weight / y)."""
    if d.numel() == 0:
        return
    dtype = a_values.dtype
    out = npu.npu_grouped_matmul([a_values], [b_values.to(dtype).transpose(1, 2)], group_list=group_ends,
                                 split_item=3, group_type=0, group_list_type=CUMULATIVE, output_dtype=dtype)[0]
    _write_rows(out, d, valid)
