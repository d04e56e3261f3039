"""Stand-in for `npu_moe_gating_top_k` (torch_npu 26.1.0 docs, "Equivalent computation logic", and
aclnnMoeGatingTopK: norm_type 1 = sigmoid, 0 = softmax; renorm 0 only; the constraints on k, k_group,
group_count; expert count <= 2048). Atlas A2/A3 only."""

from __future__ import annotations

import torch

from ._common import require

MAX_EXPERTS = 2048


class MoeGatingTopK:
    def __init__(self, owner) -> None:
        self.owner = owner

    def __call__(self, x, k, *, bias=None, input_ids=None, tid2eid=None, k_group=1, group_count=1,
                 group_select_mode=0, renorm=0, norm_type=0, out_flag=False, routed_scaling_factor=1.0, eps=1e-20):
        self.owner.record("npu_moe_gating_top_k")
        name = "npu_moe_gating_top_k"
        require(self.owner.chip == "a2a3", f"{name}: Atlas A2/A3 only (torch_npu docs)")
        require(input_ids is None and tid2eid is None, "stand-in: input_ids / tid2eid are not implemented")
        require(x.dim() == 2 and x.dtype in (torch.float16, torch.bfloat16, torch.float32),
                f"{name}: x 2-D fp16/bf16/fp32")
        e = x.shape[1]
        require(e <= MAX_EXPERTS, f"{name}: at most {MAX_EXPERTS} experts")
        require(bias is None or (bias.dim() == 1 and bias.shape[0] == e and bias.dtype == x.dtype),
                f"{name}: bias 1-D [experts], x's dtype")
        require(group_count > 0 and e % group_count == 0 and e // group_count > 2
                and -(-(e // group_count) // 32) * 32 * group_count <= MAX_EXPERTS,
                f"{name}: experts divisible by group_count, > 2 per group, align32(per group) * groups <= 2048")
        require(1 <= k_group <= group_count and k_group * e // group_count >= k and k >= 1,
                f"{name}: 1 <= k <= experts / group_count * k_group, 1 <= k_group <= group_count")
        require(renorm == 0, f"{name}: renorm 0 only")
        require(norm_type in (0, 1) and group_select_mode in (0, 1), f"{name}: norm_type and group_select_mode 0 or 1")
        xf = x.double()
        scores = torch.softmax(xf, -1) if norm_type == 0 else torch.sigmoid(xf)
        biased = scores if bias is None else scores + bias.double()
        t = x.shape[0]
        grouped = biased.view(t, group_count, e // group_count)
        if group_select_mode == 0:
            group_score = grouped.amax(-1)
        else:
            group_score = grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.sort(-group_score, dim=-1, stable=True).indices[:, :k_group]
        mask = torch.ones(t, group_count, dtype=torch.bool)
        mask[torch.arange(t)[:, None], keep] = False
        masked = grouped.masked_fill(mask[..., None], float("-inf")).view(t, e)
        idx = torch.sort(-masked, dim=-1, stable=True).indices[:, :k]
        y = scores.gather(1, idx)
        if norm_type == 1:
            y = y / (y.sum(-1, keepdim=True) + eps)
        y = y * routed_scaling_factor
        return y.to(x.dtype), idx.to(torch.int32), (scores.float() if out_flag else None)
