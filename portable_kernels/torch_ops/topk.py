"""Custom op of top-k selection. It always returns `(values, indices)`: with return_value=False
`values` is an empty [0] tensor of the input's dtype, which the route turns back into None.
DeepSelect's `output_idx` is filled by the route (a copy after the op), so the op's outputs never
alias its inputs; `hint`, `output_idx_offset` and `abort_when_nan_found` cross as they are."""

from __future__ import annotations

import torch

from ..core.compiled import ROUTES
from ..ops.topk import DEFAULT_IDX_FILL, DEFAULT_VALUE_FILL, TOPK, check_outputs
from ..ops.topk import topk as public_topk
from .boundary import define, fresh, op


def _impl(input, topk, sorted, begin, end, indices_type, sorted_index, idx_oob_fill_value, value_oob_fill_value,
          return_value, hint=None, output_idx_offset=None, abort_when_nan_found=True):
    values, indices = public_topk(input, topk, sorted, begin, end, indices_type, sorted_index, hint, None,
                                  output_idx_offset, idx_oob_fill_value, value_oob_fill_value, return_value,
                                  abort_when_nan_found)
    return fresh(((input.new_empty((0,)) if values is None else values), indices), input, end, output_idx_offset)


def _fake(input, topk, sorted, begin, end, indices_type, sorted_index, idx_oob_fill_value, value_oob_fill_value,
          return_value, hint=None, output_idx_offset=None, abort_when_nan_found=True):
    b = input.shape[0]
    values = input.new_empty((b, topk) if return_value else (0,))
    return values, input.new_empty((b, topk), dtype=indices_type)


define("topk(Tensor input, int topk, bool sorted, Tensor? begin, Tensor? end, ScalarType indices_type, "
       "bool sorted_index, int idx_oob_fill_value, float value_oob_fill_value, bool return_value, "
       "Tensor? hint=None, Tensor? output_idx_offset=None, bool abort_when_nan_found=True) "
       "-> (Tensor values, Tensor indices)", _impl, _fake)


def topk(input: torch.Tensor, topk: int, sorted: bool = False, begin: torch.Tensor | None = None,
         end: torch.Tensor | None = None, indices_type: torch.dtype = torch.int64, sorted_index: bool = False,
         hint: None = None, output_idx: torch.Tensor | None = None, output_idx_offset: torch.Tensor | None = None,
         idx_oob_fill_value: int = DEFAULT_IDX_FILL, value_oob_fill_value: float = DEFAULT_VALUE_FILL,
         return_value: bool = True, abort_when_nan_found: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    if output_idx is not None:
        check_outputs(TOPK.name, output_idx, None, input.shape[0], topk, indices_type, input.device)
    values, indices = op("topk")(input, topk, sorted, begin, end, indices_type, sorted_index, idx_oob_fill_value,
                                 value_oob_fill_value, return_value, hint, output_idx_offset, abort_when_nan_found)
    if output_idx is not None:
        output_idx.copy_(indices)
        indices = output_idx
    return (values if return_value else None), indices


ROUTES.update(topk=topk)
