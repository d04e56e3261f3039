"""Top-k provider: torch_npu's `torch.topk` (aclnnTopk on an NPU), with the contract's `end`, fill and
order rules applied by torch ops on the device (docs/ascend.md, *Top-k*).

`torch_npu.npu_top_k_top_p` is not used: it returns the logits with everything outside the top-k /
top-p set replaced by -inf (no indices, ties at the k-th value all kept, k <= 1024), a sampling filter
rather than a selection.

Invalid positions (>= end[i]) are keyed -inf and valid -inf values are keyed -FLT_MAX, so the valid
elements rank first while keeping their order; min(selected) >= max(unselected valid) then holds as
torch.topk guarantees it.
"""

from __future__ import annotations

import torch

from portable_kernels.ops.topk import fill_topk_outputs


def topk_select(input: torch.Tensor, topk: int, end: torch.Tensor | None, sorted: bool, sorted_index: bool,
                indices_type: torch.dtype, idx_oob_fill_value: int, value_oob_fill_value: float,
                return_value: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The contract of portable_kernels.topk on input bf16/fp32 [b, n] (arguments already checked)."""
    b, n = input.shape
    device = input.device
    kk = min(topk, n)
    col = torch.arange(n, device=device)
    if end is None:
        count = torch.full((b,), kk, dtype=torch.int64, device=device)
        key = input
    else:
        valid = col[None, :] < end[:, None]
        count = end.long().clamp(max=kk)
        finite_floor = torch.finfo(torch.float32).min
        key = torch.where(valid, input.float().clamp_min(finite_floor), float("-inf"))
    if kk > 0 and b > 0:
        idx = torch.topk(key, kk, dim=1, largest=True, sorted=sorted or end is not None).indices
    else:
        idx = torch.zeros(b, kk, dtype=torch.int64, device=device)
    slot_valid = torch.arange(kk, device=device)[None, :] < count[:, None]
    if sorted_index and kk > 0 and b > 0:
        idx = torch.sort(torch.where(slot_valid, idx, n), dim=1).values.clamp_max(n - 1)
    return fill_topk_outputs(input, idx, slot_valid, topk, indices_type, idx_oob_fill_value, value_oob_fill_value,
                             return_value)
