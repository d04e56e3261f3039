"""MoE routing op family (TileKernels `tile_kernels.moe` names and argument order): the DeepSeek-V3
grouped top-k gate, weight normalization, and the fused expert-major mapping with expand / reduce.

Gate contract (`top2_sum_gate`): scores = sigmoid(logits), sqrt(softplus(logits)) or softmax(logits);
ranked = scores + bias (for softmax: logits + bias), bias for selection only; experts are split into
num_groups equal groups, each group scored by the sum of its top-2 ranked values; the
num_topk_groups best groups are kept and the num_topk best experts inside them chosen. Every ranking
is stable: among equal values the smaller index wins, and the chosen experts are listed best first.
Tokens with fix_routing_mask keep the experts given for them. Weights = unbiased scores of the chosen
experts, divided by (their sum + 1e-20) when normalize, times routed_scaling_factor; masked tokens
get -1 and 0. The public `top2_sum_gate` then appends shared-expert slots, maps logical experts to
physical replicas (`map_to_physical_experts`) and keeps one TP rank's experts (`mask_indices_by_tp`).

Fused layout (`get_fused_mapping`): every (token, slot) with a non-negative expert id gets one row of
an expert-major buffer; expert e owns rows [expert_start[e], expert_end[e]), its count padded up to
`alignment` — DeepGEMM's contiguous grouped-GEMM layout, so `pos_to_expert` is exactly the grouped
GEMM's `m_indices` (-1 on padding rows). Negative expert ids are padding and map nowhere (-1). The
order of rows inside one expert's segment is unspecified (the cpu provider uses token order).

Modules: `gate` (top2_sum_gate, normalize_weight), `gate_checks` (its routing arguments), `select`
(topk_gate, topk_sum_and_topk_group_idx), `indices` (mask_indices_by_tp,
inplace_unique_group_indices, map_to_physical_experts), `counts` (group_count, aux_fi), `mapping`
(get_fused_mapping, FusedMapping), `expand` (expand_to_fused, expand_to_fused_with_sf) and `reduce`
(reduce_fused). This package re-exports every public name of the former single module.
"""

# imported in this order so the contracts register in the order the ops are documented
from .select import (TOPK_GATE, TOPK_SUM_AND_TOPK_GROUP_IDX, stable_topk, topk_gate, topk_gate_reference, topk_sum,
                     topk_sum_and_topk_group_idx, topk_sum_and_topk_group_idx_reference)
from .indices import (INPLACE_UNIQUE_GROUP_INDICES, MAP_TO_PHYSICAL_EXPERTS, MASK_INDICES_BY_TP,
                      REPLICA_HASH_MULTIPLIER, inplace_unique_group_indices, map_to_physical_experts,
                      map_to_physical_experts_reference, mask_indices_by_tp, mask_indices_by_tp_reference,
                      unique_group_indices_reference)
from .gate import (GROUP_SCORE_TOPK, NORMALIZE_EPS, NORMALIZE_WEIGHT, SCORING_FUNCS, TOP2_SUM_GATE, normalize_weight,
                   normalize_weight_reference, score_reference, top2_sum_gate, top2_sum_gate_kernel,
                   top2_sum_gate_reference)
from .mapping import (GET_FUSED_MAPPING, INDEX_DTYPES, MAPPING_DTYPE, FusedMapping, fused_mapping_reference,
                      get_fused_mapping, get_fused_mapping_kernel)
from .expand import (EXPAND_TO_FUSED, EXPAND_TO_FUSED_WITH_SF, expand_to_fused, expand_to_fused_kernel,
                     expand_to_fused_reference, expand_to_fused_with_sf)
from .reduce import FP8_FORMATS, REDUCE_DTYPES, REDUCE_FUSED, reduce_fused, reduce_fused_kernel, reduce_fused_reference
from .counts import AUX_FI, GROUP_COUNT, aux_fi, aux_fi_reference, group_count, group_count_reference

__all__ = [
    "FusedMapping", "expand_to_fused", "expand_to_fused_with_sf", "get_fused_mapping", "normalize_weight",
    "reduce_fused", "top2_sum_gate",
    "aux_fi", "group_count", "inplace_unique_group_indices", "map_to_physical_experts", "mask_indices_by_tp",
    "topk_gate", "topk_sum_and_topk_group_idx",
    "AUX_FI", "GROUP_COUNT", "INPLACE_UNIQUE_GROUP_INDICES", "MAP_TO_PHYSICAL_EXPERTS", "MASK_INDICES_BY_TP",
    "TOPK_GATE", "TOPK_SUM_AND_TOPK_GROUP_IDX", "REPLICA_HASH_MULTIPLIER", "aux_fi_reference",
    "group_count_reference", "map_to_physical_experts_reference", "mask_indices_by_tp_reference", "stable_topk",
    "topk_gate_reference", "topk_sum", "topk_sum_and_topk_group_idx_reference", "unique_group_indices_reference",
    # contracts, references, reference kernels and constants, for backends and the conformance cases
    "EXPAND_TO_FUSED", "EXPAND_TO_FUSED_WITH_SF", "GET_FUSED_MAPPING", "NORMALIZE_WEIGHT", "REDUCE_FUSED",
    "TOP2_SUM_GATE", "expand_to_fused_kernel", "expand_to_fused_reference", "fused_mapping_reference",
    "get_fused_mapping_kernel", "normalize_weight_reference", "reduce_fused_kernel", "reduce_fused_reference",
    "score_reference", "top2_sum_gate_kernel", "top2_sum_gate_reference",
    "FP8_FORMATS", "GROUP_SCORE_TOPK", "INDEX_DTYPES", "MAPPING_DTYPE", "NORMALIZE_EPS", "REDUCE_DTYPES",
    "SCORING_FUNCS",
]
