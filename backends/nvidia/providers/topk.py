"""nvidia providers of topk: the Triton radix select and DeepSelect delegation."""

from __future__ import annotations

import torch

from portable_kernels.core.registry import Registry
from portable_kernels.ops.topk import TOPK, TopkInputs, reject_nan

from ..vendor import deep_select
from ._common import BACKEND, LIBRARY_PRIORITY, TRITON, TRITON_PRIORITY, kernel, triton_devices, triton_reasons

INPUT_DTYPES = (torch.bfloat16, torch.float32)


def _triton_topk(call: TopkInputs):
    reject_nan(call.input, call.end)  # the contract's NaN rule, where values are read (see checks_values)
    return kernel("topk").topk(call.input, call.topk, call.end, call.sorted, call.sorted_index, call.indices_type,
                               call.idx_oob_fill_value, call.value_oob_fill_value, call.return_value)


def _triton_reasons(call: TopkInputs) -> list[str]:
    out = triton_reasons(call)
    if call.input.stride(-1) != 1:
        out.append("input rows must be contiguous (stride(1) == 1)")
    return out


def _deep_select_reasons(call: TopkInputs) -> list[str]:
    missing = deep_select.unavailable_reason()
    return [missing] if missing else deep_select.reasons(call.input, call.sorted)


def _deep_select(call: TopkInputs):
    reject_nan(call.input, call.end)
    kwargs = deep_select.topk_kwargs(call.topk, call.end, call.sorted, call.sorted_index, call.indices_type,
                                     call.idx_oob_fill_value, call.value_oob_fill_value, call.return_value)
    return deep_select.run(call.input, kwargs)


def _strides(call: TopkInputs):
    return call.input.stride(-1) == 1, call.input.stride(0)


def register(registry: Registry) -> None:
    registry.kernel(TOPK.name, BACKEND, TRITON, priority=TRITON_PRIORITY, dtypes={"input": INPUT_DTYPES},
                    devices=triton_devices(), check=_triton_reasons,
                    shape_class=lambda call: call.input.stride(-1) == 1,
                    doc="Triton radix select, one program per row")(_triton_topk)
    registry.kernel(TOPK.name, BACKEND, "deep_select", priority=LIBRARY_PRIORITY, dtypes={"input": INPUT_DTYPES},
                    devices=("cuda",), check=_deep_select_reasons, shape_class=_strides,
                    doc="delegates to deep_select when importable; untested on a GPU")(_deep_select)
