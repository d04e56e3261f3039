"""Custom ops of the MoE index helpers (TileKernels names): topk_gate, topk_sum_and_topk_group_idx,
mask_indices_by_tp, inplace_unique_group_indices (writes `group_indices`, `Tensor(g!)`),
map_to_physical_experts, group_count and aux_fi. Each returns fresh tensors of sizes its arguments
fix, so the fakes are one allocation each."""

from __future__ import annotations

import torch

from ..core.compiled import ROUTES
from ..ops.moe_routing import counts, indices, select
from .boundary import define, fresh, op


def _topk_gate_fake(scores, num_topk):
    return scores.new_empty((scores.shape[0], num_topk), dtype=torch.int64)


define("topk_gate(Tensor scores, int num_topk) -> Tensor",
       lambda scores, num_topk: fresh(select.topk_gate(scores, num_topk), scores), _topk_gate_fake)


def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    return op("topk_gate")(scores, num_topk)


def _group_idx_fake(scores, num_topk_sum, num_topk_groups):
    return scores.new_empty((scores.shape[0], num_topk_groups), dtype=torch.int64)


define("topk_sum_and_topk_group_idx(Tensor scores, int num_topk_sum, int num_topk_groups) -> Tensor",
       lambda scores, num_topk_sum, num_topk_groups: fresh(
           select.topk_sum_and_topk_group_idx(scores, num_topk_sum, num_topk_groups), scores), _group_idx_fake)


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    return op("topk_sum_and_topk_group_idx")(scores, num_topk_sum, num_topk_groups)


def _mask_by_tp_impl(indices_, n, num_ep_ranks, tp_rank, num_tp_ranks):
    return fresh(indices.mask_indices_by_tp(indices_, n, num_ep_ranks, tp_rank, num_tp_ranks), indices_)


define("mask_indices_by_tp(Tensor indices, int n, int num_ep_ranks, int tp_rank, int num_tp_ranks) -> Tensor",
       _mask_by_tp_impl, lambda indices_, *args: torch.empty_like(indices_, memory_format=torch.contiguous_format))


def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                       num_tp_ranks: int) -> torch.Tensor:
    return op("mask_indices_by_tp")(indices, n, num_ep_ranks, tp_rank, num_tp_ranks)


define("inplace_unique_group_indices(Tensor(g!) group_indices, int num_groups) -> ()",
       indices.inplace_unique_group_indices, lambda group_indices, num_groups: None)


def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> None:
    op("inplace_unique_group_indices")(group_indices, num_groups)


def _physical_impl(topk_idx, to_physical_map, logical_count, ep_rank):
    return fresh(indices.map_to_physical_experts(topk_idx, to_physical_map, logical_count, ep_rank), topk_idx,
                 to_physical_map, logical_count)


define("map_to_physical_experts(Tensor topk_idx, Tensor to_physical_map, Tensor logical_count, int ep_rank) "
       "-> Tensor", _physical_impl,
       lambda topk_idx, *args: topk_idx.new_empty(topk_idx.shape, dtype=torch.int64))


def map_to_physical_experts(topk_idx: torch.Tensor, to_physical_map: torch.Tensor, logical_count: torch.Tensor,
                            ep_rank: int = 0) -> torch.Tensor:
    return op("map_to_physical_experts")(topk_idx, to_physical_map, logical_count, ep_rank)


define("group_count(Tensor group_idx, int num_groups) -> Tensor",
       lambda group_idx, num_groups: fresh(counts.group_count(group_idx, num_groups), group_idx),
       lambda group_idx, num_groups: group_idx.new_empty((num_groups,), dtype=torch.int32))


def group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    return op("group_count")(group_idx, num_groups)


define("aux_fi(Tensor topk_idx, int num_experts, int num_aux_topk) -> Tensor",
       lambda topk_idx, num_experts, num_aux_topk: fresh(counts.aux_fi(topk_idx, num_experts, num_aux_topk), topk_idx),
       lambda topk_idx, num_experts, num_aux_topk: topk_idx.new_empty((num_experts,), dtype=torch.float32))


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    return op("aux_fi")(topk_idx, num_experts, num_aux_topk)


ROUTES.update(topk_gate=topk_gate, topk_sum_and_topk_group_idx=topk_sum_and_topk_group_idx,
              mask_indices_by_tp=mask_indices_by_tp, inplace_unique_group_indices=inplace_unique_group_indices,
              map_to_physical_experts=map_to_physical_experts, group_count=group_count, aux_fi=aux_fi)
