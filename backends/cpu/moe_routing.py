"""cpu provider "reference" for MoE routing: the contracts' reference kernels (gate, weight
normalization, fused mapping in token order, expand / reduce into the buffers the public op allocated)."""

from __future__ import annotations

from portable_kernels.moe_routing import (EXPAND_TO_FUSED, EXPAND_TO_FUSED_WITH_SF, GET_FUSED_MAPPING,
                                          NORMALIZE_WEIGHT, REDUCE_FUSED, TOP2_SUM_GATE)
from portable_kernels.oracle import register_reference
from portable_kernels.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    for contract in (TOP2_SUM_GATE, NORMALIZE_WEIGHT, GET_FUSED_MAPPING, EXPAND_TO_FUSED, EXPAND_TO_FUSED_WITH_SF,
                     REDUCE_FUSED):
        register_reference(registry, BACKEND, contract)
