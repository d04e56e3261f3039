"""Delegation to DeepSelect (`deep_select`) when it is importable.

DeepSelect's `topk(input, topk, sorted=False, begin=None, end=None, indices_type=torch.int64,
sorted_index=False, hint=None, output_idx=None, output_idx_offset=None, idx_oob_fill_value=2**31-1,
value_oob_fill_value=-inf, return_value=True, abort_when_nan_found=True)` (deep_select/interface.py)
is our op's own contract; it documents `sorted` for fp32 inputs only, input stride(1) == 1 and
stride(0) a multiple of `get_stride_requirement()[0]` bytes. Its outputs may be non-contiguous.
"""

from __future__ import annotations

from typing import Any

import torch

from ._probe import missing_reason, module

PACKAGE = "deep_select"


def unavailable_reason() -> str | None:
    return missing_reason(PACKAGE)


def reasons(input: torch.Tensor, sorted: bool, stride_bytes: int | None = None) -> list[str]:
    """stride_bytes: the library's input row alignment (asked from the library when None)."""
    out = []
    if sorted and input.dtype != torch.float32:
        out.append("DeepSelect sorts fp32 inputs only")
    if input.stride(-1) != 1:
        out.append("DeepSelect needs input rows contiguous (stride(1) == 1)")
    if stride_bytes is None and module(PACKAGE) is not None:
        stride_bytes = module(PACKAGE).get_stride_requirement()[0]
    if stride_bytes and input.shape[0] > 1 and (input.stride(0) * input.element_size()) % stride_bytes:
        out.append(f"DeepSelect needs a row stride that is a multiple of {stride_bytes} bytes")
    return out


def topk_kwargs(topk: int, end, sorted: bool, sorted_index: bool, indices_type, idx_oob_fill_value: int,
                value_oob_fill_value: float, return_value: bool) -> dict[str, Any]:
    """DeepSelect's keywords for our contract; NaN is refused before the call, so aborting on NaN is safe."""
    return {"topk": topk, "sorted": sorted, "end": end, "indices_type": indices_type, "sorted_index": sorted_index,
            "idx_oob_fill_value": idx_oob_fill_value, "value_oob_fill_value": value_oob_fill_value,
            "return_value": return_value, "abort_when_nan_found": True}


def run(input: torch.Tensor, kwargs: dict[str, Any], library: Any = None):
    return (library or module(PACKAGE)).topk(input, **kwargs)
