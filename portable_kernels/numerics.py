"""Numeric comparison used by tests, conformance and the demo."""

from __future__ import annotations

import torch


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """`1 - 2·Σxy / Σ(x² + y²)` in float64 over the finite positions; 0 means identical.

    NaN/Inf positions must match exactly (else the result is +inf). Two all-zero tensors give 0.
    """
    if x.shape != y.shape:
        raise ValueError(f"calc_diff: shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}")
    x, y = x.double(), y.double()
    x_bad, y_bad = ~torch.isfinite(x), ~torch.isfinite(y)
    if not torch.equal(x_bad, y_bad) or not torch.equal(x[x_bad].nan_to_num(0.0), y[y_bad].nan_to_num(0.0)):
        return float("inf")
    x, y = x[~x_bad], y[~y_bad]
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denominator)
