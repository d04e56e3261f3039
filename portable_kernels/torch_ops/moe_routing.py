"""Custom ops of MoE routing: top2_sum_gate, normalize_weight, get_fused_mapping, expand_to_fused,
expand_to_fused_with_sf and reduce_fused.

Tensor-only forms: `get_fused_mapping` returns the seven mapping tensors; the route wraps them in
a FusedMapping whose `num_tokens_per_expert_list` is [] (reading the counts on the host would
end the graph; `num_tokens_per_expert` holds the same numbers). With num_expanded_tokens=0 and
no force_no_sync the row count depends on the routing, so the fake gives it a data-dependent
size. A FusedMapping argument crosses as its token_topk_to_pos / pos_to_expert tensors.
`reduce_fused` writes `out` (`Tensor(o!)`); the route allocates it when the caller passes None.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.compiled import ROUTES
from ..ops.moe_routing import expand as expand_module
from ..ops.moe_routing import gate, mapping, reduce
from ..ops.moe_routing.mapping import FusedMapping, _unpack_mapping
from ..core.registry import select_backend
from ..core.tensors import FP8_DTYPE, QuantTensor
from .boundary import OPERAND_ARITY, define, fresh, frozen_new, op, operand_args, operand_schema, operands, selected


# -- top2_sum_gate / normalize_weight ----------------------------------------------------------------

def _gate_impl(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts,
               routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, scoring_func, mask,
               fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx, normalize):
    out = gate.top2_sum_gate(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
                             num_shared_experts, routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks,
                             scoring_func, mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx,
                             normalize=normalize)
    return fresh(out, logits, bias, mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx)


def _gate_fake(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts,
               *args):
    t, slots = logits.shape[0], num_topk + (num_shared_experts if use_shared_as_routed else 0)
    return logits.new_empty((t, slots), dtype=torch.int64), logits.new_empty((t, slots), dtype=torch.float32)


define("top2_sum_gate(Tensor logits, Tensor? bias, int num_topk, int num_topk_groups, int num_groups, "
       "bool use_shared_as_routed, int num_shared_experts, float routed_scaling_factor, int ep_rank, "
       "int num_ep_ranks, int tp_rank, int num_tp_ranks, str scoring_func, Tensor? mask, Tensor? fix_routing_mask, "
       "Tensor? to_physical_map, Tensor? logical_count, Tensor(u!)? unmapped_topk_idx, bool normalize) "
       "-> (Tensor topk_idx, Tensor topk_weights)", _gate_impl, _gate_fake)


def top2_sum_gate(logits: torch.Tensor, bias: torch.Tensor | None, num_topk: int, num_topk_groups: int,
                  num_groups: int, use_shared_as_routed: bool = False, num_shared_experts: int = 0,
                  routed_scaling_factor: float = 1.0, ep_rank: int = 0, num_ep_ranks: int = 1, tp_rank: int = 0,
                  num_tp_ranks: int = 1, scoring_func: str = "sigmoid", mask: torch.Tensor | None = None,
                  fix_routing_mask: torch.Tensor | None = None, to_physical_map: torch.Tensor | None = None,
                  logical_count: torch.Tensor | None = None, unmapped_topk_idx: torch.Tensor | None = None, *,
                  normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    return op("top2_sum_gate")(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
                               num_shared_experts, routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank,
                               num_tp_ranks, scoring_func, mask, fix_routing_mask, to_physical_map, logical_count,
                               unmapped_topk_idx, normalize)


def _normalize_fake(topk_weights):
    t, k = topk_weights.shape
    return topk_weights.new_empty((t,), dtype=torch.float32), topk_weights.new_empty((t, k), dtype=torch.float32)


def _normalize_impl(topk_weights):
    return fresh(gate.normalize_weight(topk_weights), topk_weights)


define("normalize_weight(Tensor topk_weights) -> (Tensor denominator, Tensor normalized)", _normalize_impl,
       _normalize_fake)


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return op("normalize_weight")(topk_weights)


# -- get_fused_mapping ----------------------------------------------------------------------------

def _mapping_impl(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync):
    return fresh(mapping.get_fused_mapping(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync)[:7],
                 topk_idx)


def _mapping_fake(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync):
    t, k = topk_idx.shape
    if num_expanded_tokens:
        rows = num_expanded_tokens
    elif force_no_sync:
        if alignment is None:
            alignment = select_backend(mapping.GET_FUSED_MAPPING.name, topk_idx.device, {}).backend.moe_alignment
        rows = -(-(t * k + (alignment - 1) * num_experts) // alignment) * alignment
    else:  # sized exactly from the routing: known when the graph runs
        rows = torch.library.get_ctx().new_dynamic_size()
    new = lambda *shape: topk_idx.new_empty(shape, dtype=mapping.MAPPING_DTYPE)  # noqa: E731
    return (new(rows), new(rows), new(rows), new(t, k), new(num_experts), new(num_experts), new(num_experts))


define("get_fused_mapping(Tensor topk_idx, int num_experts, int num_expanded_tokens, int? alignment, "
       "bool force_no_sync) -> (Tensor pos_to_expert, Tensor pos_to_token, Tensor pos_to_token_topk, "
       "Tensor token_topk_to_pos, Tensor expert_start, Tensor expert_end, Tensor num_tokens_per_expert)",
       _mapping_impl, _mapping_fake)


def get_fused_mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int = 0,
                      alignment: int | None = None, force_no_sync: bool = False) -> FusedMapping:
    if alignment is None:  # the backend's, fixed when the graph is traced
        alignment = selected(mapping.GET_FUSED_MAPPING.name, topk_idx.device)[2]
    out = op("get_fused_mapping")(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync)
    return FusedMapping(*out, [])


# -- expand_to_fused / expand_to_fused_with_sf ------------------------------------------------------

def _expand_impl(x, token_topk_to_pos, pos_to_expert):
    return fresh(expand_module.expand_to_fused(x, token_topk_to_pos, pos_to_expert), x, token_topk_to_pos,
                 pos_to_expert)


def _expand_fake(x, token_topk_to_pos, pos_to_expert):
    return x.new_empty((pos_to_expert.shape[0], x.shape[1]))


define("expand_to_fused(Tensor x, Tensor token_topk_to_pos, Tensor pos_to_expert) -> Tensor", _expand_impl,
       _expand_fake)


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: Any, pos_to_expert: torch.Tensor | None = None) -> torch.Tensor:
    ttp, pte = _unpack_mapping(expand_module.EXPAND_TO_FUSED.name, token_topk_to_pos, pos_to_expert, True)
    return op("expand_to_fused")(x, ttp, pte)


def _expand_sf_impl(*args):
    (x,) = operands("expand_to_fused_with_sf", ("x",), args)
    num_per_channels, token_topk_to_pos, pos_to_expert, col_major = args[OPERAND_ARITY:]
    out = expand_module.expand_to_fused_with_sf(x, num_per_channels, token_topk_to_pos, pos_to_expert, col_major)
    return out.data, out.scale


def _expand_sf_fake(*args):
    data, scale = args[:2]
    num_per_channels, token_topk_to_pos, pos_to_expert, col_major = args[OPERAND_ARITY:]
    rows, s = pos_to_expert.shape[0], scale.shape[1]
    out = data.new_empty((rows, data.shape[1]))
    if col_major:  # TMA-aligned MN-major, as the eager op allocates it
        return out, scale.new_empty((s, -(-rows // 4) * 4))[:, :rows].T
    return out, scale.new_empty((rows, s))


define(f"expand_to_fused_with_sf({operand_schema('x')}, int num_per_channels, Tensor token_topk_to_pos, "
       "Tensor pos_to_expert, bool use_tma_aligned_col_major_sf) -> (Tensor out, Tensor out_sf)",
       _expand_sf_impl, _expand_sf_fake)


def expand_to_fused_with_sf(x: Any, num_per_channels: int, token_topk_to_pos: Any,
                            pos_to_expert: torch.Tensor | None = None,
                            use_tma_aligned_col_major_sf: bool = False) -> QuantTensor:
    contract = expand_module.EXPAND_TO_FUSED_WITH_SF
    ttp, pte = _unpack_mapping(contract.name, token_topk_to_pos, pos_to_expert, True)
    out, out_sf = op("expand_to_fused_with_sf")(*operand_args(x, contract, "x"), num_per_channels, ttp, pte,
                                                use_tma_aligned_col_major_sf)
    granularity = (1, num_per_channels)
    ue8m0 = x.ue8m0 if isinstance(x, QuantTensor) else False
    return frozen_new(QuantTensor, data=out, scale=out_sf, granularity=granularity, ue8m0=ue8m0, element="e4m3",
                      signature=("quant", granularity, ue8m0, "e4m3", out.device))


# -- reduce_fused ---------------------------------------------------------------------------------

def _reduce_impl(x, x_sf, topk_weights, token_topk_to_pos, fp8_format, sf, out):
    reduce.reduce_fused(x if x_sf is None else (x, x_sf), topk_weights, token_topk_to_pos, fp8_format, sf, out)


def _reduce_fake(*args):
    return None


define("reduce_fused(Tensor x, Tensor? x_sf, Tensor? topk_weights, Tensor token_topk_to_pos, str fp8_format, "
       "Tensor? sf, Tensor(o!) out) -> ()", _reduce_impl, _reduce_fake)


def reduce_fused(x: Any, topk_weights: torch.Tensor | None, token_topk_to_pos: Any, fp8_format: str = "",
                 sf: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    ttp, _ = _unpack_mapping(reduce.REDUCE_FUSED.name, token_topk_to_pos, None, False)
    x_sf = None
    if isinstance(x, (tuple, list)):
        x, x_sf = x
    if out is None:
        dtype = FP8_DTYPE if fp8_format == "e4m3" else x.dtype
        out = torch.empty((ttp.shape[0], x.shape[1]), dtype=dtype, device=x.device)
    op("reduce_fused")(x, x_sf, topk_weights, ttp, fp8_format, sf, out)
    return out


ROUTES.update(top2_sum_gate=top2_sum_gate, normalize_weight=normalize_weight, get_fused_mapping=get_fused_mapping,
              expand_to_fused=expand_to_fused, expand_to_fused_with_sf=expand_to_fused_with_sf,
              reduce_fused=reduce_fused)
