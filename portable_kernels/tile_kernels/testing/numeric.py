"""`tile_kernels.testing.numeric`: the numeric checks of TileKernels' tests.

assert_equal compares bytes (so equal NaNs pass and -0.0 differs from 0.0), calc_diff is the cosine
style distance `1 - 2·Σxy / Σ(x² + y²)` in float64, check_bias tests that a rounding is unbiased,
count_bytes sums tensor sizes for bandwidth figures.
"""

from __future__ import annotations

import math
from typing import Union

import torch

from ...core.harness import count_bytes

__all__ = ["assert_equal", "calc_diff", "check_bias", "count_bytes"]

#: check_bias allows |less_ratio - 0.5| below CHECK_BIAS_SIGMAS / sqrt(n): the ratio of a fair rounding
#: has standard deviation 1 / (2·sqrt(n)), so this is 20 sigmas
CHECK_BIAS_SIGMAS = 10.0


def _bytes(t: torch.Tensor) -> torch.Tensor:
    # flatten first: a [N, 1] tensor with strides (1, N) is contiguous but cannot be viewed as bytes
    return t.contiguous().flatten().view(torch.uint8)


def assert_equal(x: torch.Tensor, y: torch.Tensor, check_dtype: bool = True, check_shape: bool = True,
                 check_stride: bool = True) -> None:
    """Raise AssertionError unless x and y hold the same bytes on the same device (and, unless turned
    off, the same dtype, shape and strides; strides of empty tensors are not compared)."""
    if check_dtype and x.dtype != y.dtype:
        raise AssertionError(f"Tensor dtypes are not equal: {x.dtype} vs {y.dtype}")
    if check_shape and x.shape != y.shape:
        raise AssertionError(f"Tensor shapes are not equal: {x.shape} vs {y.shape}")
    if check_stride and x.numel() != 0 and x.stride() != y.stride():
        raise AssertionError(f"Tensor strides are not equal: {x.stride()} vs {y.stride()}")
    if x.device != y.device:
        raise AssertionError(f"Tensor devices are not equal: {x.device} vs {y.device}")
    if torch.equal(_bytes(x), _bytes(y)):
        return
    detail = ""
    if x.shape == y.shape and x.dtype == y.dtype:
        differ = _bytes(x).view(x.numel(), -1).ne(_bytes(y).view(y.numel(), -1)).any(dim=1).view(x.shape)
        detail = f"\nmismatch at {torch.nonzero(differ).tolist()}\n{x[differ]}\nvs\n{y[differ]}"
    raise AssertionError(f"Tensor values are not equal: {x.shape=} vs {y.shape=}{detail}")


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> Union[torch.Tensor, int]:
    """`1 - 2·Σxy / Σ(x² + y²)` as a float64 0-dim tensor on the inputs' device (0 means identical
    up to scale-free rounding); the int 0 when both are all zero. NaN in either gives NaN."""
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0
    return 1 - 2 * (x * y).sum() / denominator


def check_bias(x: torch.Tensor, ref_x: torch.Tensor) -> None:
    """Raise AssertionError unless about half of x lies below ref_x (ties count half): a rounding
    from ref_x to x that is unbiased passes with overwhelming probability. Empty tensors pass."""
    count = x.numel()
    if count == 0:
        return
    less = int((x < ref_x).sum())
    equal = int((x == ref_x).sum())
    less_ratio = (less + equal / 2) / count
    if abs(less_ratio - 0.5) >= CHECK_BIAS_SIGMAS / math.sqrt(count):
        raise AssertionError(
            f"Less than ratio not close to 0.5 (size = {count}): {less_ratio=:.4f}\n"
            f"Expected:\n  {ref_x.flatten()}\nActual:\n  {x.flatten()}\n"
            f"  Less than: {less}\n  Equal to: {equal}\n  Greater than: {count - less - equal}")
