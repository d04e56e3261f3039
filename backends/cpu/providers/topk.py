"""Native top-k of the cpu backend (C++ in topk.cpp): radix select per row, DeepSelect semantics.

`topk_native(input, topk, end, sorted, indices_type, idx_fill, value_fill, return_value)` is a plain
function of tensors; it validates shapes, dtypes and strides before the C++ runs. Unordered and
`sorted_index` results are both in increasing index order (one pass emits them so); `sorted`
orders the selections by value, ties by index.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from pathlib import Path

import torch

from portable_kernels.core.native.build import I64, PTR, NativeLibrary, num_threads, register_library
from portable_kernels.ops.topk import reject_nan

from .._names import BACKEND, NATIVE
from . import _checks as chk

LIB = register_library(NativeLibrary("cpu_topk", Path(__file__).parent.parent / "kernels" / "topk.cpp", {
    "pk_topk": [PTR],  # one TopkCall (packed below)
    "pk_topk_call_size": [],
}, returns={"pk_topk": I64, "pk_topk_call_size": I64}, owner=BACKEND))

#: topk.cpp's TopkCall: 14 native 64-bit words (Q: an address, 0 for null; q: an integer), in its order
_CALL = struct.Struct("=" + "".join((
    "Qqqqq",   # input, bf16, b, n, row_stride
    "Qqq",     # end, topk, sorted
    "Qqq",     # indices, idx64, idx_fill
    "Qqq",     # values, value_fill, threads
)))


class _CallBuffer(threading.local):
    """This thread's TopkCall buffer (ctypes releases the GIL during the call, so concurrent callers
    each pack into their own; allocated once per thread, never per call)."""

    def __init__(self) -> None:
        self.raw = ctypes.create_string_buffer(_CALL.size)
        self.address = ctypes.addressof(self.raw)


_buffer = _CallBuffer()

INPUT_DTYPES = (torch.float32, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
_FILL_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


#: (fill value, dtype) -> its bits; zeros are not kept: -0.0 and 0.0 are one key but differ in bits
_FILLS: dict[tuple[float, torch.dtype], int] = {}


def _fill_bits(value: float, dtype: torch.dtype) -> int:
    """The bits of `value` rounded to `dtype` (as a cast rounds), as an unsigned int."""
    bits = _FILLS.get((value, dtype)) if value else None
    if bits is None:
        bits = int(torch.tensor([value], dtype=dtype).view(_FILL_BITS[dtype])[0])
        bits &= 0xFFFF if dtype == torch.bfloat16 else 0xFFFFFFFF
        if value:
            if len(_FILLS) >= 64:
                _FILLS.clear()
            _FILLS[(value, dtype)] = bits
    return bits


#: per (rows, cols, indices dtype, values dtype): a [rows, cols] tensor of each, whose empty_like is
#: a new output (see _templates)
_TEMPLATES: dict[tuple[int, int, torch.dtype, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
_MAX_TEMPLATES = 256
#: outputs of up to this many elements get templates that hold their own memory (12 KiB at most)
_MAX_CONTIGUOUS_TEMPLATE = 1024
_BF16 = torch.bfloat16
_I64 = torch.int64
_empty_like = torch.empty_like


def _templates(rows: int, cols: int, indices_type: torch.dtype,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Templates of the two outputs (kept): torch.empty_like of a template is ~0.3 µs cheaper than
    torch.empty (no size or dtype arguments to parse), a tenth of a small top-k call. A small one is
    a contiguous tensor (~0.1 µs cheaper again); a larger one is one element expanded to the shape,
    which holds no memory (empty_like of an overlapping tensor is contiguous: torch.preserve_format's
    rule)."""
    if rows * cols <= _MAX_CONTIGUOUS_TEMPLATE:
        pair = (torch.empty(rows, cols, dtype=indices_type), torch.empty(rows, cols, dtype=dtype))
    else:
        pair = (torch.empty(1, dtype=indices_type).expand(rows, cols), torch.empty(1, dtype=dtype).expand(rows, cols))
    if len(_TEMPLATES) >= _MAX_TEMPLATES:
        _TEMPLATES.clear()
    _TEMPLATES[(rows, cols, indices_type, dtype)] = pair
    return pair


def topk_native(input: torch.Tensor, topk: int, end: torch.Tensor | None = None, sorted: bool = False,
                indices_type: torch.dtype = torch.int64, idx_oob_fill_value: int = 2**31 - 1,
                value_oob_fill_value: float = float("-inf"),
                return_value: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The top `topk` of each row's first end[i] elements: (values | None, indices), [b, topk] each.

    input: fp32/bf16 [b, n], unit stride along n (a non-unit stride is copied first). end: None or
    int32 [b]. Slots past min(topk, end[i]) hold the fills. A NaN inside a row's valid range is found
    in the kernel's own pass and raises the contract's ContractError (portable_kernels.ops.topk.reject_nan).
    """
    op = "topk"
    lib = LIB.get()
    if lib is None:
        raise RuntimeError(f"{op}: native topk unavailable: {LIB.reason()}")
    # each tensor attribute is read once (they cost ~0.1 µs apiece on a call that takes a few µs)
    dtype = input.dtype if isinstance(input, torch.Tensor) else None
    if dtype not in INPUT_DTYPES or not input.is_cpu:
        chk.tensor(op, "input", input, INPUT_DTYPES, None, "pass scores as fp32 or bf16 [b, n]")
    shape = input.shape
    if len(shape) != 2:
        chk.fail(op, "input", f"{len(shape)}-D", "[b, n]", "pass a 2-D tensor")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        chk.fail(op, "topk", repr(topk), "a positive int", "pass e.g. 8")
    b, n = shape
    if input.is_contiguous():
        row_stride = n  # (a single row's stride is never read)
    else:
        strides = input.stride()
        if n > 1 and strides[1] != 1:
            input = input.contiguous()
            strides = input.stride()
        row_stride = strides[0] if b > 1 else n
    if end is not None:
        chk.tensor(op, "end", end, (torch.int32,), (b,), "pass int32 lengths [b]")
        end = end.contiguous()
    if indices_type not in INDEX_DTYPES:
        chk.fail(op, "indices_type", repr(indices_type), "torch.int32 or torch.int64", "pass one of those")
    if type(idx_oob_fill_value) is not int or not -2**63 <= idx_oob_fill_value < 2**63:
        chk.fail(op, "idx_oob_fill_value", repr(idx_oob_fill_value), "an int64", "pass e.g. -1 or 2**31 - 1")
    templates = _TEMPLATES.get((b, topk, indices_type, dtype)) or _templates(b, topk, indices_type, dtype)
    indices = _empty_like(templates[0])
    values = _empty_like(templates[1]) if return_value else None
    if b:
        buf = _buffer
        _CALL.pack_into(buf.raw, 0, input.data_ptr(), dtype is _BF16, b, n, row_stride,
                        0 if end is None else end.data_ptr(), topk, 1 if sorted else 0, indices.data_ptr(),
                        indices_type is _I64, idx_oob_fill_value, 0 if values is None else values.data_ptr(),
                        _FILLS.get((value_oob_fill_value, dtype)) or _fill_bits(value_oob_fill_value, dtype),
                        num_threads() if b > 1 else 1)
        if lib.pk_topk(buf.address):
            reject_nan(input, end)  # the contract's message (it raises)
            raise AssertionError("topk: native NaN scan and reject_nan disagree")
    return values, indices


def topk_provider(call) -> tuple[torch.Tensor | None, torch.Tensor]:
    """TopkInputs -> (values | None, indices) with the native kernel."""
    return topk_native(call.input, call.topk, call.end, call.sorted, call.indices_type, call.idx_oob_fill_value,
                       call.value_oob_fill_value, call.return_value)


def register(registry) -> None:
    from portable_kernels.ops.topk import TOPK
    registry.kernel(TOPK.name, BACKEND, NATIVE, priority=10, dtypes={"input": INPUT_DTYPES}, devices=("cpu",),
                    check=lambda call: [] if LIB.get() is not None else [f"native topk unavailable: {LIB.reason()}"],
                    doc="C++ (deepjit): radix select per row, rows in parallel")(topk_provider)
