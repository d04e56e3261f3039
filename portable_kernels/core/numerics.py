"""Numeric comparison used by tests, conformance and the demo."""

from __future__ import annotations

import torch

from .errors import ContractError, format_problem
from .tensors import describe


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """`1 - 2·Σxy / Σ(x² + y²)` in float64 over the finite positions; 0 means identical.

    NaN/Inf positions must match exactly (else the result is +inf). Two all-zero tensors give 0.
    Both are scaled by their largest magnitude first, so values near the float64 range (1e200) do
    not overflow the squares. Complex tensors are refused (compare .real and .imag separately).
    """
    for arg, t in (("x", x), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise ContractError(format_problem("calc_diff", arg, describe(t), "a tensor", "pass torch tensors"))
        if t.is_complex():
            raise ContractError(format_problem("calc_diff", arg, f"a complex tensor ({t.dtype})", "a real tensor",
                                               "compare the real and imaginary parts separately"))
    if x.shape != y.shape:
        raise ContractError(f"calc_diff: shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}")
    x, y = x.double(), y.double()
    x_bad, y_bad = ~torch.isfinite(x), ~torch.isfinite(y)
    if not torch.equal(x_bad, y_bad) or not torch.equal(x[x_bad].nan_to_num(0.0), y[y_bad].nan_to_num(0.0)):
        return float("inf")
    x, y = x[~x_bad], y[~y_bad]
    if x.numel() == 0:
        return 0.0
    magnitude = torch.maximum(x.abs().max(), y.abs().max())
    if magnitude > 0:
        x, y = x / magnitude, y / magnitude
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denominator)
