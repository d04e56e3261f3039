"""Argument checks of the cpu native kernels' Python wrappers (CPU tensors, K-major row strides,
data pointers), on top of the shared kernel-side checks of portable_kernels.core.checks: every
kernel validates shapes, strides, dtypes and devices before its C++ runs, so native code never
reads out of bounds."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from portable_kernels.core.checks import contiguous, fail
from portable_kernels.core.tensors import describe

__all__ = ["contiguous", "describe", "fail", "is_plain", "ptr", "row_stride", "tensor"]


def tensor(op: str, arg: str, t: Any, dtypes: Iterable[torch.dtype], shape: tuple[int, ...] | None = None,
           fix: str = "pass a tensor as the kernel documents") -> torch.Tensor:
    """t is a CPU tensor of one of `dtypes` (and of `shape` when given); returns it."""
    dtypes = tuple(dtypes)
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes:
        fail(op, arg, describe(t), f"a tensor of dtype {' or '.join(str(d) for d in dtypes)}", fix)
    if t.device.type != "cpu":
        fail(op, arg, f"on {t.device}", "a CPU tensor (the cpu backend's native kernels)", f"move {arg} to the CPU")
    if shape is not None and tuple(t.shape) != tuple(shape):
        fail(op, arg, f"of shape {tuple(t.shape)}", f"shape {list(shape)}", fix)
    return t


def is_plain(t: Any, dtypes: tuple[torch.dtype, ...], shape: tuple[int, ...]) -> bool:
    """t is a contiguous CPU tensor of one of `dtypes` and of `shape`: the common case, read in a few
    attribute accesses. When False, callers run `tensor` and `contiguous`, which raise the error
    naming what is wrong."""
    return (isinstance(t, torch.Tensor) and t.dtype in dtypes and t.is_cpu and t.shape == shape
            and t.is_contiguous())


def row_stride(op: str, arg: str, t: torch.Tensor, shape: tuple[int, ...] | None = None) -> int:
    """Row stride (elements) of a K-major operand: a 2-D [rows, K] tensor with unit stride along K
    and non-overlapping rows (a slice of a wider buffer is fine); other ranks must be contiguous.
    shape: t.shape when the caller has read it already."""
    if shape is None:
        shape = t.shape
    if len(shape) != 2:
        contiguous(op, arg, t)
        return shape[-1]
    (rows, k), strides = shape, t.stride()
    if k > 1 and strides[1] != 1:
        fail(op, arg, f"with strides {strides}", "unit stride along K (K-major)", f"pass {arg}.contiguous()")
    row = strides[0] if rows > 1 else k
    if row < k:
        fail(op, arg, f"with row stride {row} < K = {k}", "rows that do not overlap", f"pass {arg}.contiguous()")
    return row


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
