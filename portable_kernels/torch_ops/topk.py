"""Custom op of top-k selection. It always returns `(values, indices)`: with return_value=False
`values` is an empty [0] tensor of the input's dtype, which the route turns back into None.
DeepSelect's `output_idx` stays with the route (a copy after the op), so the op's outputs never
alias its inputs; `hint`, `output_idx_offset` and `abort_when_nan_found` were appended to the
published schema (last, with their defaults). Schema, route and implementation come from the
public signature (`declare.custom_op`)."""

from __future__ import annotations

from typing import Any

import torch

from ..ops import topk as topk_module
from .declare import custom_op


def _outputs(value: tuple[torch.Tensor | None, torch.Tensor], input: torch.Tensor, **_: Any) -> tuple:
    values, indices = value
    return (input.new_empty((0,)) if values is None else values), indices


def _fake(input: torch.Tensor, topk: int, indices_type: torch.dtype, return_value: bool, **_: Any) -> tuple:
    b = input.shape[0]
    values = input.new_empty((b, topk) if return_value else (0,))
    return values, input.new_empty((b, topk), dtype=indices_type)


def _result(outputs: tuple, input: torch.Tensor, topk: int, indices_type: torch.dtype, output_idx: Any,
            return_value: bool, **_: Any) -> tuple[torch.Tensor | None, torch.Tensor]:
    values, indices = outputs
    if output_idx is not None:
        topk_module.check_outputs(topk_module.TOPK.name, output_idx, None, input.shape[0], topk, indices_type,
                                  input.device)
        output_idx.copy_(indices)
        indices = output_idx
    return (values if return_value else None), indices


custom_op(topk_module.topk, local=("output_idx",), tail=("hint", "output_idx_offset", "abort_when_nan_found"),
          types={"begin": "Tensor?", "hint": "Tensor?"}, returns="(Tensor values, Tensor indices)", fake=_fake,
          outputs=_outputs, result=_result)
