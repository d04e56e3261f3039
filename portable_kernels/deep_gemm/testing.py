"""`deep_gemm.testing`: the numeric helpers DeepGEMM's tests use (calc_diff, count_bytes)."""

from __future__ import annotations

from typing import Any

from ..core.numerics import calc_diff

__all__ = ["calc_diff", "count_bytes"]


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
