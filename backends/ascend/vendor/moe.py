"""MoE gate provider over `npu_moe_gating_top_k` (Atlas A2/A3; docs/ascend.md, *MoE routing*).

`top2_sum_gate(scoring_func="sigmoid", normalize=True)` is
`npu_moe_gating_top_k(x, k, bias=, k_group=num_topk_groups, group_count=num_groups, group_select_mode=1,
renorm=0, norm_type=1, routed_scaling_factor=, eps=1e-20)`: norm_type 1 = sigmoid (aclnnMoeGatingTopK
and the torch_npu page's reference code), groups ranked by the sum of their top-2 biased scores,
stable ranking (ties to the smaller index), weights = unbiased scores / (sum + eps) · factor.
Without grouping (num_groups = 0) the op runs with one group holding every expert.
"""

from __future__ import annotations

from typing import Any

import torch

#: npu_moe_gating_top_k arguments that select the DeepSeek-V3 gate
GROUP_SELECT_TOP2_SUM = 1
NORM_SIGMOID = 1
RENORM_BEFORE_TOPK = 0
#: aclnnMoeGatingTopK limits: experts <= 2048, > 2 experts per group, align32(per group) · groups <= 2048
MAX_EXPERTS = 2048
MIN_EXPERTS_PER_GROUP_EXCLUSIVE = 2
GROUP_ALIGN = 32


def gate_limits_reason(num_experts: int, num_groups: int) -> str | None:
    """Why npu_moe_gating_top_k cannot take this expert / group count (None when it can)."""
    groups = num_groups or 1
    per_group = num_experts // groups
    if num_experts > MAX_EXPERTS:
        return f"npu_moe_gating_top_k takes at most {MAX_EXPERTS} experts, got {num_experts}"
    if per_group <= MIN_EXPERTS_PER_GROUP_EXCLUSIVE:
        return f"npu_moe_gating_top_k needs more than 2 experts per group, got {per_group}"
    if -(-per_group // GROUP_ALIGN) * GROUP_ALIGN * groups > MAX_EXPERTS:
        return (f"npu_moe_gating_top_k needs align32(experts per group) x groups <= {MAX_EXPERTS}, "
                f"got align32({per_group}) x {groups}")
    return None


def sigmoid_top2_sum_gate(npu: Any, logits: torch.Tensor, bias: torch.Tensor | None, num_topk: int,
                          num_topk_groups: int, num_groups: int, routed_scaling_factor: float,
                          mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_idx int64 [T, k], topk_weights fp32 [T, k]) for fp32 logits [T, E]."""
    weights, idx, _ = npu.npu_moe_gating_top_k(
        logits, num_topk, bias=bias, k_group=num_topk_groups or 1, group_count=num_groups or 1,
        group_select_mode=GROUP_SELECT_TOP2_SUM, renorm=RENORM_BEFORE_TOPK, norm_type=NORM_SIGMOID,
        out_flag=False, routed_scaling_factor=routed_scaling_factor, eps=1e-20)
    idx = idx.long()
    weights = weights.float()
    if mask is not None:
        idx = idx.masked_fill(~mask[:, None], -1)
        weights = weights.masked_fill(~mask[:, None], 0.0)
    return idx, weights
