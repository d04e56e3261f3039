"""TileKernels' `tile_kernels.moe`: the MoE gate, the fused expert-major mapping, expand / reduce,
counts and expert-id rewrites, with TileKernels' exact signatures over the portable ops.

Submodule as TileKernels': `scoring` (ScoringFunc, which the gate takes as well as its name). The
kernels themselves are the portable ops: names whose op already has TileKernels' signature are that
op itself; the others are thin wrappers that only fix the signature or the return type (a tuple
where the portable op returns a richer value). Results: as TileKernels, on every backend.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ...core.errors import ContractError, format_problem
from ...ops import moe_routing as _ops
# these portable ops already take TileKernels' arguments in its order and return its types
from ...ops.moe_routing import (aux_fi, group_count, inplace_unique_group_indices, mask_indices_by_tp,
                                normalize_weight, reduce_fused, topk_gate, topk_sum_and_topk_group_idx)
from . import scoring
from .scoring import ScoringFunc, scoring_name

__all__ = ["ScoringFunc", "aux_fi", "expand_to_fused", "expand_to_fused_with_sf", "get_fused_mapping", "group_count",
           "inplace_unique_group_indices", "mask_indices_by_tp", "normalize_weight", "reduce_fused", "scoring",
           "top2_sum_gate", "topk_gate", "topk_sum_and_topk_group_idx"]


def get_fused_mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int,
                      force_no_sync: bool = False) -> tuple:
    """(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
    num_tokens_per_expert, num_tokens_per_expert_list): see `portable_kernels.get_fused_mapping`
    (num_expanded_tokens 0 sizes the buffer exactly, with a host sync unless force_no_sync)."""
    return _ops.get_fused_mapping(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync)


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """[P, H] in x's dtype: each token copied to its rows, padding rows zero."""
    return _ops.expand_to_fused(x, token_topk_to_pos, pos_to_expert)


def expand_to_fused_with_sf(x: tuple, num_per_channels: int, token_topk_to_pos: torch.Tensor,
                            pos_to_expert: torch.Tensor,
                            use_tma_aligned_col_major_sf: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(out fp8 [P, H], out_sf) from x = (fp8 [T, H], fp32 [T, S] or packed int32 [T, ceil(S/4)] scales);
    out_sf keeps the input scales' dtype, MN-major with strides (1, align(P, 4)) when
    use_tma_aligned_col_major_sf."""
    out, out_sf = _ops.expand_to_fused_with_sf(x, num_per_channels, token_topk_to_pos, pos_to_expert,
                                               use_tma_aligned_col_major_sf)
    return out, out_sf


def top2_sum_gate(logits: torch.Tensor, bias: torch.Tensor, num_topk: int, num_topk_groups: int, num_groups: int,
                  use_shared_as_routed: bool, num_shared_experts: int, routed_scaling_factor: float, ep_rank: int,
                  num_ep_ranks: int, tp_rank: int, num_tp_ranks: int, scoring_func: Union[str, ScoringFunc],
                  mask: Optional[torch.Tensor] = None, fix_routing_mask: Optional[torch.Tensor] = None,
                  to_physical_map: Optional[torch.Tensor] = None, logical_count: Optional[torch.Tensor] = None,
                  unmapped_topk_idx: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_idx int64 [T, num_topk + shared], topk_weights fp32 [T, num_topk + shared]): TileKernels'
    gate, weights always normalized; see `portable_kernels.top2_sum_gate` for every argument.

    scoring_func: "sigmoid", "sqrtsoftplus", "softmax" (any case, as TileKernels' ScoringFunc.from_str)
    or the ScoringFunc member; IDENTITY is refused, as TileKernels refuses it for this gate."""
    name = scoring_name(scoring_func)
    if name == str(ScoringFunc.IDENTITY):
        raise ContractError(format_problem(
            "top2_sum_gate", "scoring_func", repr(scoring_func), "sigmoid, sqrtsoftplus or softmax",
            "TileKernels' top-2-sum gate has no identity scoring either; pass ScoringFunc.SIGMOID (DeepSeek-V3)"))
    return _ops.top2_sum_gate(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
                              num_shared_experts, routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank,
                              num_tp_ranks, name, mask, fix_routing_mask, to_physical_map, logical_count,
                              unmapped_topk_idx)
