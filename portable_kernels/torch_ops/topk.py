"""Custom op of top-k selection. It always returns `(values, indices)`: with return_value=False
`values` is an empty [0] tensor of the input's dtype, which the route turns back into None."""

from __future__ import annotations

import torch

from ..topk import DEFAULT_IDX_FILL, DEFAULT_VALUE_FILL
from ..topk import topk as public_topk
from ..compiled import ROUTES
from .boundary import define, fresh, op


def _impl(input, topk, sorted, begin, end, indices_type, sorted_index, idx_oob_fill_value, value_oob_fill_value,
          return_value):
    values, indices = public_topk(input, topk, sorted, begin, end, indices_type, sorted_index,
                                  idx_oob_fill_value=idx_oob_fill_value, value_oob_fill_value=value_oob_fill_value,
                                  return_value=return_value)
    return fresh(((input.new_empty((0,)) if values is None else values), indices), input, end)


def _fake(input, topk, sorted, begin, end, indices_type, sorted_index, idx_oob_fill_value, value_oob_fill_value,
          return_value):
    b = input.shape[0]
    values = input.new_empty((b, topk) if return_value else (0,))
    return values, input.new_empty((b, topk), dtype=indices_type)


define("topk(Tensor input, int topk, bool sorted, Tensor? begin, Tensor? end, ScalarType indices_type, "
       "bool sorted_index, int idx_oob_fill_value, float value_oob_fill_value, bool return_value) "
       "-> (Tensor values, Tensor indices)", _impl, _fake)


def topk(input: torch.Tensor, topk: int, sorted: bool = False, begin: torch.Tensor | None = None,
         end: torch.Tensor | None = None, indices_type: torch.dtype = torch.int64, sorted_index: bool = False, *,
         idx_oob_fill_value: int = DEFAULT_IDX_FILL,
         value_oob_fill_value: float = DEFAULT_VALUE_FILL,
         return_value: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    values, indices = op("topk")(input, topk, sorted, begin, end, indices_type, sorted_index, idx_oob_fill_value,
                                 value_oob_fill_value, return_value)
    return (values if return_value else None), indices


ROUTES.update(topk=topk)
