"""`deep_gemm.testing.numeric`: the numeric checks DeepGEMM's tests use (calc_diff, count_bytes,
assert_bitwise_equal)."""

from __future__ import annotations


import torch

from ...core.harness import count_bytes
from ...core.numerics import calc_diff

__all__ = ["assert_bitwise_equal", "calc_diff", "count_bytes"]


def assert_bitwise_equal(x: torch.Tensor, y: torch.Tensor, label: str = "") -> None:
    """Raise AssertionError unless x and y have the same shape, dtype and bytes; the message names
    the mismatch count and the first differing element (coordinate, bytes, values)."""
    assert x.shape == y.shape, f"shape {tuple(x.shape)} != {tuple(y.shape)}{f' ({label})' if label else ''}"
    assert x.dtype == y.dtype, f"dtype {x.dtype} != {y.dtype}{f' ({label})' if label else ''}"
    xb, yb = x.contiguous().view(torch.uint8).flatten(), y.contiguous().view(torch.uint8).flatten()
    differ = xb != yb
    if not bool(differ.any()):
        return
    first = int(differ.nonzero()[0].item())
    element = first // x.element_size()
    coord = tuple(int(c) for c in torch.unravel_index(torch.tensor(element), tuple(x.shape)))
    raise AssertionError(
        f"bitwise mismatch{f' ({label})' if label else ''}: {int(differ.sum())} of {differ.numel()} bytes differ; "
        f"first at byte {first} (element {element}, coord {coord}, byte {first % x.element_size()}): "
        f"x byte {int(xb[first])} value {x.flatten()[element].item()}, "
        f"y byte {int(yb[first])} value {y.flatten()[element].item()}")
