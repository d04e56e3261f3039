"""cpu provider "reference" for MoE routing: the contracts' reference kernels (gate, weight
normalization, fused mapping in token order, expand / reduce into the buffers the public op allocated,
the stable selections, counts and expert-id rewrites)."""

from __future__ import annotations

from portable_kernels.ops.moe_routing import (AUX_FI, EXPAND_TO_FUSED, EXPAND_TO_FUSED_WITH_SF, GET_FUSED_MAPPING,
                                          GROUP_COUNT, INPLACE_UNIQUE_GROUP_INDICES, MAP_TO_PHYSICAL_EXPERTS,
                                          MASK_INDICES_BY_TP, NORMALIZE_WEIGHT, REDUCE_FUSED, TOP2_SUM_GATE, TOPK_GATE,
                                          TOPK_SUM_AND_TOPK_GROUP_IDX)
from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    for contract in (TOP2_SUM_GATE, NORMALIZE_WEIGHT, GET_FUSED_MAPPING, EXPAND_TO_FUSED, EXPAND_TO_FUSED_WITH_SF,
                     REDUCE_FUSED, TOPK_GATE, TOPK_SUM_AND_TOPK_GROUP_IDX, GROUP_COUNT, AUX_FI, MASK_INDICES_BY_TP,
                     INPLACE_UNIQUE_GROUP_INDICES, MAP_TO_PHYSICAL_EXPERTS):
        register_reference(registry, BACKEND, contract)
