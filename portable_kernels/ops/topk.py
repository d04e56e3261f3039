"""Top-k selection op family (DeepSelect names and argument order): the k largest elements per row.

`topk(input, topk, sorted=False, begin=None, end=None, indices_type=torch.int64, sorted_index=False, hint=None,
output_idx=None, output_idx_offset=None, idx_oob_fill_value=2**31-1, value_oob_fill_value=-inf,
return_value=True, abort_when_nan_found=True) -> (values | None, indices)` — DeepSelect's signature.
Contract: input bf16/fp32 [b, n]; row i holds end[i] valid elements (its first ones; end=None: all n);
each row returns min(topk, end[i]) valid selections first, then fill values. The chosen set is any
set of that size with min(selected) >= max(unselected valid) — ties are broken freely, ±0 compare
equal, ±inf are ordinary values. Unordered unless `sorted` (values non-increasing) or `sorted_index`
(indices increasing), never both. NaN policy: a NaN inside a row's valid range is refused with a
ContractError naming 'input' before anything runs (NaN past end[i] is ignored); this costs one pass
over the input and a host sync, the price of an exact contract. With abort_when_nan_found=False
the op instead selects from a copy with NaN read as -inf and writes DeepSelect's marker
0x3F3F3F3F into every index of a row that held NaN (values NaN) — device ops, no sync; providers
never see NaN then. output_idx (a buffer to write) and output_idx_offset (added to every valid
index) are applied by the op after the provider, so providers keep one inputs value.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from ..core.checks import check_bool
from ..core.compiled import compiled_call, is_compiling
from ..core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ..core.dispatch import run
from ..core.errors import ContractError, format_problem
from ..core.providers import Inputs
from ..core.tensors import describe

INPUT_DTYPES = (torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
END_DTYPE = torch.int32
#: DeepSelect's largest supported k
MAX_TOPK = 4096
DEFAULT_IDX_FILL = 2**31 - 1
DEFAULT_VALUE_FILL = float("-inf")
#: what DeepSelect writes into the indices of a row with NaN when asked not to abort
NAN_ROW_MARKER = 0x3F3F3F3F
_INDEX_BOUNDS = {dtype: (torch.iinfo(dtype).min, torch.iinfo(dtype).max) for dtype in INDEX_DTYPES}


def topk_reference(input: torch.Tensor, topk: int, end: torch.Tensor | None = None, sorted: bool = False,
                   sorted_index: bool = False, indices_type: torch.dtype = torch.int64,
                   idx_oob_fill_value: int = DEFAULT_IDX_FILL, value_oob_fill_value: float = DEFAULT_VALUE_FILL,
                   return_value: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Reference math: the top `topk` of each row's valid prefix, ties to the smaller index.

    Unordered output is returned in increasing index order (one of the orders the contract allows).
    """
    b, n = input.shape
    device = input.device
    col = torch.arange(n, device=device)
    lengths = torch.full((b,), n, dtype=torch.int64, device=device) if end is None else end.to(torch.int64)
    valid = col[None, :] < lengths[:, None]
    count = lengths.clamp(max=topk)
    kk = min(topk, n)
    idx = torch.zeros(b, kk, dtype=torch.int64, device=device)
    if kk > 0 and b > 0:
        keyed = input.float().masked_fill(~valid, float("-inf"))
        kth = torch.topk(keyed, kk, dim=1).values[:, -1:]
        above = valid & (keyed > kth)
        ties = valid & (keyed == kth)
        need = (count - above.sum(1))[:, None]
        selected = above | (ties & (torch.cumsum(ties, 1) <= need))
        # the selected columns in increasing order: largest keys n - col among the selected
        idx = torch.topk(torch.where(selected, n - col[None, :], 0), kk, dim=1).values.neg_().add_(n)
        idx.clamp_(max=n - 1)  # unselected slots (key 0) point past the row; they are masked below
    slot_valid = torch.arange(kk, device=device)[None, :] < count[:, None]
    if sorted and kk > 0 and b > 0:
        vals = input.float().gather(1, idx).masked_fill(~slot_valid, float("-inf"))
        order = torch.sort(vals, dim=1, descending=True, stable=True).indices
        # valid slots first even where their value is -inf like the empty slots
        order = order.gather(1, torch.sort(slot_valid.gather(1, order).to(torch.int8), dim=1, descending=True,
                                           stable=True).indices)
        idx = idx.gather(1, order)
    return fill_topk_outputs(input, idx, slot_valid, topk, indices_type, idx_oob_fill_value, value_oob_fill_value,
                             return_value)


def fill_topk_outputs(input: torch.Tensor, idx: torch.Tensor, slot_valid: torch.Tensor, topk: int,
                      indices_type: torch.dtype, idx_oob_fill_value: int, value_oob_fill_value: float,
                      return_value: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The contract's outputs from the selected columns: idx int64 [b, kk] (kk = min(topk, n), any
    in-range column where a slot is not valid) and slot_valid bool [b, kk]; slots past kk and invalid
    slots get the fill values. Shared by providers built from torch ops."""
    b, kk = idx.shape
    if kk < topk:
        idx = torch.cat((idx, idx.new_zeros(b, topk - kk)), 1)
        slot_valid = torch.cat((slot_valid, slot_valid.new_zeros(b, topk - kk)), 1)
    indices = torch.where(slot_valid, idx, idx_oob_fill_value).to(indices_type)
    if not return_value:
        return None, indices
    fill = torch.full((b, topk), value_oob_fill_value, dtype=input.dtype, device=input.device)
    values = torch.where(slot_valid, input.gather(1, idx), fill) if input.shape[1] else fill
    return values, indices


@attrs.frozen
class TopkInputs(Inputs):
    """One topk call (validated): input bf16/fp32 [b, n], topk in [1, 4096], end None or int32 [b];
    flags and fills as in `topk`. A provider returns (values | None, indices)."""

    input: torch.Tensor
    topk: int
    end: torch.Tensor | None
    sorted: bool
    sorted_index: bool
    indices_type: torch.dtype
    idx_oob_fill_value: int
    value_oob_fill_value: float
    return_value: bool
    device_field = "input"

    def dims(self) -> dict[str, int]:
        b, n = self.input.shape
        return {"b": b, "n": n, "topk": self.topk}

    def signature(self) -> tuple:
        """`Inputs.signature` written out for these fields: the same tuple at half the cost of the
        generic walk (a small call pays it every time); other field types take the generic walk."""
        input, end, sorted, sorted_index, return_value = (self.input, self.end, self.sorted, self.sorted_index,
                                                          self.return_value)
        if (type(input) is torch.Tensor and (end is None or type(end) is torch.Tensor) and type(sorted) is bool
                and type(sorted_index) is bool and type(return_value) is bool
                and type(self.indices_type) is torch.dtype):
            return ((input.dtype, input.device), None if end is None else (end.dtype, end.device), sorted,
                    sorted_index, self.indices_type, return_value)
        return Inputs.signature(self)


def reject_nan(input: torch.Tensor, end: torch.Tensor | None) -> None:
    """Raise the contract's ContractError if a row holds NaN inside its valid range (where values
    may be read, see checks_values). The NaN rule costs a pass over the data, so it is checked in
    the provider's own pass: every provider calls this (or finds NaN itself and then calls this
    for the message) before it returns."""
    if not checks_values(input):
        return  # reading device memory would synchronize; see contract.checks_values
    nan = torch.isnan(input)
    if end is not None:
        nan &= torch.arange(input.shape[1], device=input.device)[None, :] < end[:, None].to(torch.int64)
    if bool(nan.any()):
        row, col = (int(v) for v in nan.nonzero()[0])
        raise ContractError(format_problem(TOPK.name, "input", f"NaN inside the valid range ({int(nan.sum())} NaN, "
                                           f"first at [{row}, {col}])", "no NaN in the first end[i] elements of row i",
                                           "replace NaN before selecting (torch.nan_to_num(x, nan=float('-inf'))) "
                                           "or exclude those columns with end"))


def topk_kernel(call: TopkInputs) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Reference kernel of topk: refuses NaN in a valid range, returns (values | None, indices)."""
    reject_nan(call.input, call.end)
    return topk_reference(call.input, call.topk, call.end, call.sorted, call.sorted_index, call.indices_type,
                          call.idx_oob_fill_value, call.value_oob_fill_value, call.return_value)


TOPK = register_contract(OpContract("topk", topk_reference, Tolerance(dequantized=0.0), kernel=topk_kernel))


def _check_input(op: str, input: Any) -> None:
    if not isinstance(input, torch.Tensor) or input.dtype not in INPUT_DTYPES or input.dim() != 2:
        raise ContractError(format_problem(op, "input", describe(input), f"a 2-D tensor [b, n] of dtype {INPUT_DTYPES}",
                                           "pass scores as bf16 or fp32 [batch, vocab] (x.float() for others)"))


def _check_value_fill(op: str, value: Any, dtype: torch.dtype) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ContractError(format_problem(op, "value_oob_fill_value", repr(value), "a float",
                                           "pass e.g. float('-inf')"))
    limit = torch.finfo(dtype).max
    if math.isfinite(value) and abs(value) > limit:
        raise ContractError(format_problem(op, "value_oob_fill_value", repr(value),
                                           f"a value {dtype} can hold (|v| <= {limit:.4g}) or ±inf",
                                           "pass float('-inf') or a smaller fill"))


def _check_end(op: str, end: Any, b: int, n: int, device: torch.device) -> None:
    if end is None:
        return
    if not isinstance(end, torch.Tensor) or end.dtype != END_DTYPE or tuple(end.shape) != (b,):
        raise ContractError(format_problem(op, "end", describe(end), f"None or an int32 tensor of shape [b] = [{b}]",
                                           "pass per-row valid lengths as torch.int32 [batch]"))
    if end.device != device:
        raise ContractError(format_problem(op, "end", f"on {end.device}", f"on {device} like input",
                                           "move end to input's device"))
    if b and checks_values(end) and bool(((end < 0) | (end > n)).any()):
        lo, hi = int(end.min()), int(end.max())
        raise ContractError(format_problem(op, "end", f"with values in [{lo}, {hi}]", f"values in [0, n = {n}]",
                                           "clamp the row lengths to the input's width"))


@public_op(TOPK)
def topk(input: torch.Tensor, topk: int, sorted: bool = False, begin: None = None, end: torch.Tensor | None = None,
         indices_type: torch.dtype = torch.int64, sorted_index: bool = False, hint: None = None,
         output_idx: torch.Tensor | None = None, output_idx_offset: torch.Tensor | None = None,
         idx_oob_fill_value: int = DEFAULT_IDX_FILL, value_oob_fill_value: float = DEFAULT_VALUE_FILL,
         return_value: bool = True, abort_when_nan_found: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The `topk` largest elements of each row (DeepSelect `deep_select.topk`).

    input: bf16 or fp32 [b, n]; topk: int, 1 <= topk <= 4096 (topk > n is allowed: the rest is fill)
    sorted: values in non-increasing order; sorted_index: indices in increasing order (not both)
    begin: must be None (DeepSelect does not support it either; kept for its argument order)
    end: None or int32 [b], 0 <= end[i] <= n: only the first end[i] elements of row i are candidates
    indices_type: torch.int64 or torch.int32
    idx_oob_fill_value / value_oob_fill_value: written after the min(topk, end[i]) valid slots
        (the value fill is stored in input's dtype, rounded as a cast rounds)
    return_value: False returns (None, indices)
    hint: must be None (DeepSelect does not support it either; a ValueError, as its tests expect)
    output_idx: None or an indices_type [b, topk] tensor the indices are written into (and returned)
    output_idx_offset: None or int32 [b]: added to every valid index of row i (not to the fill value)
    abort_when_nan_found: True raises ContractError for a NaN in a valid range (found in the provider's
        pass over the data, see reject_nan); False writes NAN_ROW_MARKER (0x3F3F3F3F) into every index
        of such a row and NaN into its values
    Returns (values: input.dtype [b, topk] | None, indices: indices_type [b, topk]).
    """
    if is_compiling():
        return compiled_call("topk", input, topk, sorted, begin, end, indices_type, sorted_index, hint, output_idx,
                             output_idx_offset, idx_oob_fill_value, value_oob_fill_value, return_value,
                             abort_when_nan_found)
    bounds = _INDEX_BOUNDS.get(indices_type)
    # the common call passes every check in one expression; any other runs the checks one by one,
    # which raise the error naming the argument
    if not (type(input) is torch.Tensor and input.dtype in INPUT_DTYPES and input.dim() == 2
            and type(topk) is int and 1 <= topk <= MAX_TOPK and type(sorted) is bool and type(sorted_index) is bool
            and type(return_value) is bool and type(abort_when_nan_found) is bool and hint is None
            and not (sorted and sorted_index) and begin is None and bounds is not None
            and type(idx_oob_fill_value) is int and bounds[0] <= idx_oob_fill_value <= bounds[1]):
        _check_arguments(input, topk, sorted, begin, indices_type, sorted_index, hint, idx_oob_fill_value,
                         return_value, abort_when_nan_found)
    if value_oob_fill_value != DEFAULT_VALUE_FILL:
        _check_value_fill(TOPK.name, value_oob_fill_value, input.dtype)
    if type(value_oob_fill_value) is not float:
        value_oob_fill_value = float(value_oob_fill_value)
    if end is not None or output_idx is not None or output_idx_offset is not None:
        b, n = input.shape
        _check_end(TOPK.name, end, b, n, input.device)
        check_outputs(TOPK.name, output_idx, output_idx_offset, b, topk, indices_type, input.device)
    source = input if abort_when_nan_found else torch.nan_to_num(input, nan=float("-inf"), posinf=math.inf,
                                                                 neginf=-math.inf)
    values, indices = run(TOPK, TopkInputs(source, topk, end, sorted, sorted_index, indices_type, idx_oob_fill_value,
                                           value_oob_fill_value, return_value))
    if output_idx_offset is not None:
        valid = torch.arange(topk, device=input.device)[None, :] < _valid_counts(end, b, n, topk, input.device)
        shifted = (indices.to(torch.int64) + output_idx_offset.to(torch.int64)[:, None]).to(indices_type)
        indices = torch.where(valid, shifted, indices)
    if not abort_when_nan_found:
        nan_rows = torch.isnan(input)
        if end is not None:
            nan_rows &= torch.arange(n, device=input.device)[None, :] < end[:, None].to(torch.int64)
        nan_rows = nan_rows.any(dim=1, keepdim=True)
        indices = indices.masked_fill(nan_rows, NAN_ROW_MARKER)
        if values is not None:
            values = values.masked_fill(nan_rows, float("nan"))
    if output_idx is not None:
        output_idx.copy_(indices)
        indices = output_idx
    return values, indices


def _check_arguments(input: Any, topk: Any, sorted: Any, begin: Any, indices_type: Any, sorted_index: Any,
                     hint: Any, idx_oob_fill_value: Any, return_value: Any, abort_when_nan_found: Any) -> None:
    """topk's scalar and input checks one by one, in the order their errors take precedence."""
    op = TOPK.name
    _check_input(op, input)
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise ContractError(format_problem(op, "topk", repr(topk), f"an int in [1, {MAX_TOPK}]",
                                           f"select at most {MAX_TOPK} elements per row (torch.topk for more)"))
    for arg, value in (("sorted", sorted), ("sorted_index", sorted_index), ("return_value", return_value),
                       ("abort_when_nan_found", abort_when_nan_found)):
        check_bool(op, arg, value)
    if hint is not None:
        raise ContractError(format_problem(op, "hint", describe(hint), "None (not supported, as in DeepSelect)",
                                           "drop the hint"))
    if sorted and sorted_index:
        raise ContractError(format_problem(op, "sorted_index", "True together with sorted=True",
                                           "at most one of sorted (by value) and sorted_index (by index)",
                                           "choose one order; sort the other way afterwards if both are needed"))
    if begin is not None:
        raise ContractError(format_problem(op, "begin", describe(begin), "None (per-row start offsets are not "
                                           "supported, as in DeepSelect)", "slice the input, or pass end only"))
    bounds = _INDEX_BOUNDS.get(indices_type)
    if bounds is None:
        raise ContractError(format_problem(op, "indices_type", repr(indices_type), f"one of {INDEX_DTYPES}",
                                           "pass torch.int32 or torch.int64"))
    if type(idx_oob_fill_value) is not int or not bounds[0] <= idx_oob_fill_value <= bounds[1]:
        raise ContractError(format_problem(op, "idx_oob_fill_value", repr(idx_oob_fill_value),
                                           f"an int representable in {indices_type}", "pass e.g. -1 or 2**31 - 1"))


def _valid_counts(end: torch.Tensor | None, b: int, n: int, topk: int, device: torch.device) -> torch.Tensor:
    """[b, 1] int64: how many leading slots of each row hold a selection (the rest is fill)."""
    lengths = torch.full((b,), n, dtype=torch.int64, device=device) if end is None else end.to(torch.int64)
    return lengths.clamp(max=topk)[:, None]


def check_outputs(op: str, output_idx: Any, output_idx_offset: Any, b: int, topk: int, indices_type: torch.dtype,
                   device: torch.device) -> None:
    if output_idx is not None:
        if not isinstance(output_idx, torch.Tensor) or output_idx.dtype != indices_type:
            raise ContractError(format_problem(op, "output_idx", describe(output_idx),
                                               f"None or a {indices_type} tensor (indices_type)",
                                               "allocate output_idx with dtype=indices_type"))
        if tuple(output_idx.shape) != (b, topk) or output_idx.device != device:
            raise ContractError(format_problem(op, "output_idx", describe(output_idx),
                                               f"[b, topk] = [{b}, {topk}] on {device}",
                                               "allocate output_idx = torch.empty(b, topk, dtype=indices_type)"))
    if output_idx_offset is not None:
        if not isinstance(output_idx_offset, torch.Tensor) or output_idx_offset.dtype != END_DTYPE \
                or tuple(output_idx_offset.shape) != (b,) or output_idx_offset.device != device:
            raise ContractError(format_problem(op, "output_idx_offset", describe(output_idx_offset),
                                               f"None or an int32 tensor [b] = [{b}] on {device}",
                                               "pass one int32 offset per row"))
