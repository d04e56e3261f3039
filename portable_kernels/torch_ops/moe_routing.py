"""Custom ops of MoE routing: top2_sum_gate, normalize_weight, get_fused_mapping, expand_to_fused,
expand_to_fused_with_sf and reduce_fused.

Tensor-only forms: `get_fused_mapping` returns the seven mapping tensors; the route wraps them in
a FusedMapping whose `num_tokens_per_expert_list` is [] (reading the counts on the host would
end the graph; `num_tokens_per_expert` holds the same numbers). With num_expanded_tokens=0 and
no force_no_sync the row count depends on the routing, so the fake gives it a data-dependent
size. A FusedMapping argument crosses as its token_topk_to_pos / pos_to_expert tensors.
`reduce_fused` writes `out` (`Tensor(o!)`); the route allocates it when the caller passes None.
Schema, route and implementation come from the public signatures (`declare.custom_op`); this
module holds the routes' unpacking and allocations, the results and the fakes.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.registry import select_backend
from ..core.tensors import FP8_DTYPE, QuantTensor
from ..ops.moe_routing import expand as expand_module
from ..ops.moe_routing import gate, mapping, reduce
from ..ops.moe_routing.mapping import FusedMapping, _unpack_mapping
from .boundary import OPERAND_FIELDS, frozen_new, operand_args, rebuild_operand, selected
from .declare import Crossing, custom_op

#: a mapping argument (a FusedMapping, or token_topk_to_pos with pos_to_expert) crosses as its tensors
_MAPPING_TYPES = {"token_topk_to_pos": "Tensor", "pos_to_expert": "Tensor"}


# -- top2_sum_gate / normalize_weight ----------------------------------------------------------------

def _gate_fake(logits: torch.Tensor, num_topk: int, use_shared_as_routed: bool, num_shared_experts: int,
               **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    t, slots = logits.shape[0], num_topk + (num_shared_experts if use_shared_as_routed else 0)
    return logits.new_empty((t, slots), dtype=torch.int64), logits.new_empty((t, slots), dtype=torch.float32)


def _normalize_fake(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t, k = topk_weights.shape
    return topk_weights.new_empty((t,), dtype=torch.float32), topk_weights.new_empty((t, k), dtype=torch.float32)


custom_op(gate.top2_sum_gate, writes=("unmapped_topk_idx",), returns="(Tensor topk_idx, Tensor topk_weights)",
          fake=_gate_fake)
custom_op(gate.normalize_weight, returns="(Tensor denominator, Tensor normalized)", fake=_normalize_fake)


# -- get_fused_mapping ----------------------------------------------------------------------------

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


def _mapping_alignment(topk_idx: torch.Tensor, alignment: int | None, **_: Any) -> dict[str, int]:
    """The backend's alignment when the caller passes None, fixed when the graph is traced."""
    return {} if alignment is not None else {"alignment": selected(mapping.GET_FUSED_MAPPING.name, topk_idx.device)[2]}


custom_op(mapping.get_fused_mapping,
          returns="(Tensor pos_to_expert, Tensor pos_to_token, Tensor pos_to_token_topk, Tensor token_topk_to_pos, "
                  "Tensor expert_start, Tensor expert_end, Tensor num_tokens_per_expert)",
          fake=_mapping_fake, before=_mapping_alignment, outputs=lambda value, **_: value[:7],
          result=lambda outputs, **_: FusedMapping(*outputs, []))


# -- expand_to_fused / expand_to_fused_with_sf ------------------------------------------------------

def _unpacked(op_name: str) -> Any:
    def before(token_topk_to_pos: Any, pos_to_expert: torch.Tensor | None, **_: Any) -> dict[str, Any]:
        ttp, pte = _unpack_mapping(op_name, token_topk_to_pos, pos_to_expert, True)
        return {"token_topk_to_pos": ttp, "pos_to_expert": pte}
    return before


def _expand_fake(x: torch.Tensor, pos_to_expert: torch.Tensor, **_: Any) -> torch.Tensor:
    return x.new_empty((pos_to_expert.shape[0], x.shape[1]))


custom_op(expand_module.expand_to_fused, types=_MAPPING_TYPES, before=_unpacked(expand_module.EXPAND_TO_FUSED.name),
          returns="Tensor", fake=_expand_fake)


def _expand_sf_fake(x_data: torch.Tensor, x_scale: torch.Tensor, pos_to_expert: torch.Tensor,
                    use_tma_aligned_col_major_sf: bool, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    rows, s = pos_to_expert.shape[0], x_scale.shape[1]
    out = x_data.new_empty((rows, x_data.shape[1]))
    if use_tma_aligned_col_major_sf:  # TMA-aligned MN-major, as the eager op allocates it
        return out, x_scale.new_empty((s, -(-rows // 4) * 4))[:, :rows].T
    return out, x_scale.new_empty((rows, s))


def _expand_sf_result(outputs: tuple, x: Any, num_per_channels: int, **_: Any) -> QuantTensor:
    out, out_sf = outputs
    granularity = (1, num_per_channels)
    ue8m0 = x.ue8m0 if isinstance(x, QuantTensor) else False
    return frozen_new(QuantTensor, data=out, scale=out_sf, granularity=granularity, ue8m0=ue8m0, element="e4m3",
                      signature=("quant", granularity, ue8m0, "e4m3", out.device))


# x is a quantized operand (its ten OPERAND_FIELDS), as the GEMMs' are
_EXPAND_SF_X = Crossing(
    tuple((kind, f"x_{field}") for kind, field in OPERAND_FIELDS),
    lambda x: operand_args(x, expand_module.EXPAND_TO_FUSED_WITH_SF, "x"),
    lambda *fields: rebuild_operand(expand_module.EXPAND_TO_FUSED_WITH_SF.name, "x", *fields))

custom_op(expand_module.expand_to_fused_with_sf, types=_MAPPING_TYPES, crossings={"x": _EXPAND_SF_X},
          before=_unpacked(expand_module.EXPAND_TO_FUSED_WITH_SF.name), returns="(Tensor out, Tensor out_sf)",
          fake=_expand_sf_fake, outputs=lambda value, **_: (value.data, value.scale), result=_expand_sf_result,
          fresh_outputs=False)


# -- reduce_fused ---------------------------------------------------------------------------------

#: x is a tensor or an FP8 (data, scale) pair: it crosses as `Tensor x, Tensor? x_sf`
_REDUCE_X = Crossing((("Tensor", "x"), ("Tensor?", "x_sf")),
                     lambda x: (x[0], x[1]) if isinstance(x, (tuple, list)) else (x, None),
                     lambda x, x_sf: x if x_sf is None else (x, x_sf))


def _reduce_before(x: Any, token_topk_to_pos: Any, fp8_format: str, out: torch.Tensor | None,
                   **_: Any) -> dict[str, Any]:
    """The mapping's token_topk_to_pos, and `out` allocated when the caller passes None."""
    ttp, _pte = _unpack_mapping(reduce.REDUCE_FUSED.name, token_topk_to_pos, None, False)
    if out is None:
        data = x[0] if isinstance(x, (tuple, list)) else x
        dtype = FP8_DTYPE if fp8_format == "e4m3" else data.dtype
        out = torch.empty((ttp.shape[0], data.shape[1]), dtype=dtype, device=data.device)
    return {"token_topk_to_pos": ttp, "out": out}


custom_op(reduce.reduce_fused, writes=("out",), types={"token_topk_to_pos": "Tensor", "out": "Tensor"},
          crossings={"x": _REDUCE_X}, before=_reduce_before, result=lambda outputs, out, **_: out)
