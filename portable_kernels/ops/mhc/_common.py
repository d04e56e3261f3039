"""Shared pieces of the mHC contracts: the argument checks every op of the family makes, and the
one Inputs shape they all use (a tuple of validated tensors plus the op's scalar parameters)."""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from ...core.checks import fail
from ...core.providers import Inputs
from ...core.tensors import describe

#: calc_diff bound of an fp32 result against the reference (orders of fp32 sums differ)
FP32_TOLERANCE = 1e-9
#: calc_diff bound of a result rounded once to bf16
BF16_TOLERANCE = 1e-5


@attrs.frozen
class MhcInputs(Inputs):
    """One validated mHC call: `tensors` in the public op's order (contiguous, on one device) and
    `params` its scalar arguments in order. A provider returns what the op's reference returns."""

    tensors: tuple[torch.Tensor, ...]
    params: tuple[Any, ...] = ()
    device_field = "tensors"

    def dims(self) -> dict[str, int]:
        t = self.tensors[0]
        return {"N": t.numel() // max(t.shape[-1], 1) if t.dim() else 1, "H": t.shape[-1] if t.dim() else 1}


def tensor(op: str, arg: str, t: Any, dtypes: tuple[torch.dtype, ...], shape: tuple[int | None, ...] | None,
           device: torch.device | None, fix: str, min_dim: int = 1) -> torch.Tensor:
    """`t` is a tensor of one of `dtypes`; with `shape`, exactly that shape (None: any size); else at
    least `min_dim` dims; on `device` when given. Returns it contiguous."""
    names = " or ".join(str(d).replace("torch.", "") for d in dtypes)
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes:
        fail(op, arg, describe(t), f"a {names} tensor", fix)
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and t.shape[i] != s for i, s in enumerate(shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            fail(op, arg, f"of shape {list(t.shape)}", f"shape {want}", fix)
    elif t.dim() < min_dim:
        fail(op, arg, f"of shape {list(t.shape)}", f"at least {min_dim} dims", fix)
    if device is not None and t.device != device:
        fail(op, arg, f"on {t.device}", f"on {device} like the first operand", f"move {arg} to {device}")
    return t.contiguous()


def number(op: str, arg: str, value: Any, low: float | None = None, fix: str = "") -> float:
    """A finite real number (not a bool), >= low when given."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (low is not None and value < low):
        want = "a finite number" + ("" if low is None else f" >= {low}")
        fail(op, arg, repr(value), want, fix or f"pass {arg} as a float")
    return float(value)
