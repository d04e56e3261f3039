"""nvidia providers of MoE routing: Triton top2_sum_gate, normalize_weight, get_fused_mapping,
expand_to_fused(_with_sf), reduce_fused, the expert-id rewrites (mask_indices_by_tp,
map_to_physical_experts, inplace_unique_group_indices) and the stable selections (topk_gate,
topk_sum_and_topk_group_idx)."""

from __future__ import annotations

from portable_kernels.ops.moe_routing import (EXPAND_TO_FUSED, EXPAND_TO_FUSED_WITH_SF, GET_FUSED_MAPPING,
                                             INPLACE_UNIQUE_GROUP_INDICES, MAP_TO_PHYSICAL_EXPERTS,
                                             MASK_INDICES_BY_TP, NORMALIZE_WEIGHT, REDUCE_FUSED, TOP2_SUM_GATE,
                                             TOPK_GATE, TOPK_SUM_AND_TOPK_GROUP_IDX)
from portable_kernels.core.registry import Registry

from ._common import BACKEND, TRITON, TRITON_PRIORITY, kernel, triton_devices, triton_reasons

#: the widest row of scores (padded to powers of two) a selection program holds (kernels/moe_select.py MAX_ROW)
MAX_SELECT_ROW = 4096


def _gate(call):
    return kernel("moe_gate").top2_sum_gate(call.logits, call.bias, call.num_topk, call.num_topk_groups,
                                            call.num_groups, call.routed_scaling_factor, call.scoring_func,
                                            call.normalize, call.mask, call.fixed_topk_idx, call.fix_routing_mask)


def _normalize(call):
    return kernel("moe_normalize").normalize_weight(call.topk_weights)


def _mapping(call):
    return kernel("moe_mapping").get_fused_mapping(call.topk_idx, call.num_experts, call.num_expanded_tokens,
                                                   call.alignment)


def _mask_by_tp(call):
    return kernel("moe_indices").mask_indices_by_tp(call.indices, call.n, call.num_ep_ranks, call.tp_rank,
                                                    call.num_tp_ranks)


def _physical(call):
    return kernel("moe_indices").map_to_physical_experts(call.topk_idx, call.to_physical_map, call.logical_count,
                                                         call.ep_rank)


def _unique_groups(call) -> None:
    kernel("moe_indices").inplace_unique_group_indices(call.group_indices)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _select_row(call) -> int:
    shape = call.scores.shape
    return _pow2(shape[1]) if call.scores.dim() == 2 else _pow2(shape[1]) * _pow2(shape[2])


def _select_fits(call) -> bool:
    return _select_row(call) <= MAX_SELECT_ROW


def _select_reasons(call) -> list[str]:
    out = triton_reasons(call)
    if not _select_fits(call):
        out.append(f"a row of {_select_row(call)} padded scores is over the {MAX_SELECT_ROW} a program holds")
    return out


def _topk_gate(call):
    return kernel("moe_select").topk_gate(call.scores, call.num_topk)


def _group_select(call):
    return kernel("moe_select").topk_sum_and_topk_group_idx(call.scores, call.num_topk_sum, call.num_topk_groups)


def _expand(call) -> None:
    kernel("moe_expand").expand_to_fused(call.x, call.x_sf, call.token_topk_to_pos, call.pos_to_expert, call.out,
                                         call.out_sf)


def _reduce(call) -> None:
    kernel("moe_reduce").reduce_fused(call.x, call.x_sf, call.topk_weights, call.token_topk_to_pos, call.sf, call.fp8,
                                      call.out)


def _contiguous_rows(call) -> list[str]:
    out = triton_reasons(call)
    if call.x.dim() == 2 and call.x.shape[1] > 1 and call.x.stride(1) != 1:
        out.append("x rows must be contiguous")
    return out


def register(registry: Registry) -> None:
    registry.kernel(TOP2_SUM_GATE.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                    check=triton_reasons, doc="Triton, BLOCK_T tokens x all experts per program")(_gate)
    registry.kernel(NORMALIZE_WEIGHT.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                    check=triton_reasons, doc="Triton, fp32 sum in slot order and IEEE division (the reference's bytes)")(
        _normalize)
    registry.kernel(GET_FUSED_MAPPING.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                    check=triton_reasons, doc="Triton, count / scan / place passes, no atomics (the reference's rows)")(
        _mapping)
    for contract, fn, doc in ((MASK_INDICES_BY_TP, _mask_by_tp, "Triton, one elementwise pass"),
                              (MAP_TO_PHYSICAL_EXPERTS, _physical, "Triton, one gather from the replica map"),
                              (INPLACE_UNIQUE_GROUP_INDICES, _unique_groups, "Triton, pairwise compare within a row")):
        registry.kernel(contract.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                        check=triton_reasons, doc=doc)(fn)
    for contract, fn in ((TOPK_GATE, _topk_gate), (TOPK_SUM_AND_TOPK_GROUP_IDX, _group_select)):
        registry.kernel(contract.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                        check=_select_reasons, shape_class=_select_fits,
                        doc="Triton, iterated arg-max (ties to the smaller index), BLOCK_T tokens per program")(fn)
    for contract in (EXPAND_TO_FUSED, EXPAND_TO_FUSED_WITH_SF):
        registry.kernel(contract.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                        check=_contiguous_rows, shape_class=lambda call: call.x.stride(-1) == 1,
                        doc="Triton, bit copies into the expert-major rows")(_expand)
    registry.kernel(REDUCE_FUSED.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                    check=_contiguous_rows, shape_class=lambda call: call.x.stride(-1) == 1,
                    doc="Triton, fp32 accumulation in slot order")(_reduce)
