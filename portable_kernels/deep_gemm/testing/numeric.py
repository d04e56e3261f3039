"""`deep_gemm.testing.numeric`: the numeric checks DeepGEMM's tests use (calc_diff, count_bytes,
assert_bitwise_equal)."""

from __future__ import annotations

from typing import Any

import torch

from ...core.numerics import calc_diff

__all__ = ["assert_bitwise_equal", "calc_diff", "count_bytes"]


def count_bytes(*tensors: Any) -> int:
    """Bytes of every tensor given (tuples and pairs such as QuantTensors are walked; None counts 0)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "element_size"):
            total += t.numel() * t.element_size()
        else:
            total += count_bytes(*t)
    return total


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
