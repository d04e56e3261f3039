"""Numeric comparison used by tests, conformance and the demo, and the exactly rounded fp32 fma the
references use where a kernel rounds a multiply-add once."""

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


def fma_fp32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 `a · b + c` rounded once (an IEEE fma), on any device, broadcasting.

    The fp32 product is exact in float64; the float64 sum with c is made round-to-odd (its residual,
    from an error-free two-sum, decides the last bit), and rounding that to fp32 is then the
    correctly rounded result, because float64 carries more than two bits beyond fp32's 24.
    """
    a64, b64, c64 = a.double(), b.double(), c.double()
    product = a64 * b64
    total = product + c64
    back = total - c64
    residual = (c64 - (total - back)) + (product - back)
    bits = total.view(torch.int64)
    even = (bits & 1) == 0
    inexact = (residual != 0) & even & torch.isfinite(total)
    toward = torch.where(residual > 0, torch.full_like(total, float("inf")), torch.full_like(total, float("-inf")))
    total = torch.where(inexact, torch.nextafter(total, toward), total)
    return total.float()
