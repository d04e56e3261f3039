"""Native top-k of the cpu backend (C++ in topk.cpp): radix select per row, DeepSelect semantics.

`topk_native(input, topk, end, sorted, indices_type, idx_fill, value_fill, return_value)` is a plain
function of tensors; it validates shapes, dtypes and strides before the C++ runs. Unordered and
`sorted_index` results are both in increasing index order (one pass emits them so); `sorted`
orders the selections by value, ties by index.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from portable_kernels.native.build import I32, I64, PTR, U32, NativeLibrary, num_threads, register_library
from portable_kernels.topk import reject_nan

from .._names import BACKEND
from . import _checks as chk
from ._names import NATIVE

LIB = register_library(NativeLibrary("cpu_topk", Path(__file__).with_name("topk.cpp"), {
    "pk_topk": [PTR, I32, I64, I64, I64, PTR, I64, I32, PTR, I32, I64, PTR, U32, I32],
}, returns={"pk_topk": I64}, owner=BACKEND))

INPUT_DTYPES = (torch.float32, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
_FILL_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


@functools.lru_cache(maxsize=64)
def _fill_bits(value: float, dtype: torch.dtype) -> int:
    """The bits of `value` rounded to `dtype` (as a cast rounds), as an unsigned int."""
    bits = int(torch.tensor([value], dtype=dtype).view(_FILL_BITS[dtype])[0])
    return bits & (0xFFFF if dtype == torch.bfloat16 else 0xFFFFFFFF)


def topk_native(input: torch.Tensor, topk: int, end: torch.Tensor | None = None, sorted: bool = False,
                indices_type: torch.dtype = torch.int64, idx_oob_fill_value: int = 2**31 - 1,
                value_oob_fill_value: float = float("-inf"),
                return_value: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The top `topk` of each row's first end[i] elements: (values | None, indices), [b, topk] each.

    input: fp32/bf16 [b, n], unit stride along n (a non-unit stride is copied first). end: None or
    int32 [b]. Slots past min(topk, end[i]) hold the fills. A NaN inside a row's valid range is found
    in the kernel's own pass and raises the contract's ContractError (portable_kernels.topk.reject_nan).
    """
    op = "topk"
    lib = LIB.get()
    if lib is None:
        raise RuntimeError(f"{op}: native topk unavailable: {LIB.reason()}")
    chk.tensor(op, "input", input, INPUT_DTYPES, None, "pass scores as fp32 or bf16 [b, n]")
    if input.dim() != 2:
        chk.fail(op, "input", f"{input.dim()}-D", "[b, n]", "pass a 2-D tensor")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        chk.fail(op, "topk", repr(topk), "a positive int", "pass e.g. 8")
    if input.shape[1] > 1 and input.stride(1) != 1:
        input = input.contiguous()
    b, n = input.shape
    if end is not None:
        chk.tensor(op, "end", end, (torch.int32,), (b,), "pass int32 lengths [b]")
        end = end.contiguous()
    if indices_type not in INDEX_DTYPES:
        chk.fail(op, "indices_type", repr(indices_type), "torch.int32 or torch.int64", "pass one of those")
    indices = torch.empty(b, topk, dtype=indices_type)
    values = torch.empty(b, topk, dtype=input.dtype) if return_value else None
    if b:
        row = input.stride(0) if b > 1 else n
        nan_rows = lib.pk_topk(input.data_ptr(), int(input.dtype == torch.bfloat16), b, n, row, chk.ptr(end), topk, int(sorted),
                    indices.data_ptr(), int(indices_type == torch.int64), idx_oob_fill_value, chk.ptr(values),
                    _fill_bits(value_oob_fill_value, input.dtype), num_threads())
        if nan_rows:
            reject_nan(input, end)  # the contract's message (it raises)
            raise AssertionError("topk: native NaN scan and reject_nan disagree")
    return values, indices


def topk_provider(call) -> tuple[torch.Tensor | None, torch.Tensor]:
    """TopkInputs -> (values | None, indices) with the native kernel."""
    return topk_native(call.input, call.topk, call.end, call.sorted, call.indices_type, call.idx_oob_fill_value,
                       call.value_oob_fill_value, call.return_value)


def register(registry) -> None:
    from portable_kernels.topk import TOPK
    registry.kernel(TOPK.name, BACKEND, NATIVE, priority=10, dtypes={"input": INPUT_DTYPES}, devices=("cpu",),
                    check=lambda call: [] if LIB.get() is not None else [f"native topk unavailable: {LIB.reason()}"],
                    doc="C++ (deepjit): radix select per row, rows in parallel")(topk_provider)
