"""Custom ops of the MoE index helpers (TileKernels names): topk_gate, topk_sum_and_topk_group_idx,
mask_indices_by_tp, inplace_unique_group_indices (writes `group_indices`, `Tensor(g!)`),
map_to_physical_experts, group_count and aux_fi. Each returns fresh tensors of sizes its arguments
fix, so the fakes are one allocation each; schema, route and implementation come from the public
signatures (`declare.custom_op`)."""

from __future__ import annotations

from typing import Any

import torch

from ..ops.moe_routing import counts, indices, select
from .declare import custom_op


def _topk_gate_fake(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    return scores.new_empty((scores.shape[0], num_topk), dtype=torch.int64)


def _group_idx_fake(scores: torch.Tensor, num_topk_groups: int, **_: Any) -> torch.Tensor:
    return scores.new_empty((scores.shape[0], num_topk_groups), dtype=torch.int64)


def _mask_by_tp_fake(indices: torch.Tensor, **_: Any) -> torch.Tensor:
    return torch.empty_like(indices, memory_format=torch.contiguous_format)


def _physical_fake(topk_idx: torch.Tensor, **_: Any) -> torch.Tensor:
    return topk_idx.new_empty(topk_idx.shape, dtype=torch.int64)


def _group_count_fake(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    return group_idx.new_empty((num_groups,), dtype=torch.int32)


def _aux_fi_fake(topk_idx: torch.Tensor, num_experts: int, **_: Any) -> torch.Tensor:
    return topk_idx.new_empty((num_experts,), dtype=torch.float32)


custom_op(select.topk_gate, returns="Tensor", fake=_topk_gate_fake)
custom_op(select.topk_sum_and_topk_group_idx, returns="Tensor", fake=_group_idx_fake)
custom_op(indices.mask_indices_by_tp, returns="Tensor", fake=_mask_by_tp_fake)
custom_op(indices.inplace_unique_group_indices, writes=("group_indices",))
custom_op(indices.map_to_physical_experts, returns="Tensor", fake=_physical_fake)
custom_op(counts.group_count, returns="Tensor", fake=_group_count_fake)
custom_op(counts.aux_fi, returns="Tensor", fake=_aux_fi_fake)
