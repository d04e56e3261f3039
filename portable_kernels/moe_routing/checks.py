"""Argument validation shared by the MoE routing ops; each raises a ContractError naming the argument."""

from __future__ import annotations

from typing import Any

import torch

from ..contract import checks_values
from ..errors import ContractError, format_problem
from ..tensors import describe


def _check_int(op: str, arg: str, value: Any, low: int, high: int | None = None, fix: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        want = f"an int in [{low}, {high}]" if high is not None else f"an int >= {low}"
        raise ContractError(format_problem(op, arg, repr(value), want, fix or f"pass {want}"))


def _check_bool(op: str, arg: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ContractError(format_problem(op, arg, repr(value), "a bool", "pass True or False"))


def _check_tensor(op: str, arg: str, t: Any, dtypes: tuple[torch.dtype, ...], shape: tuple[int | None, ...],
                  device: torch.device | None, fix: str) -> None:
    """dtype in dtypes, len(shape) dims, each fixed size matching (None: any), on `device`."""
    ok_shape = isinstance(t, torch.Tensor) and t.dim() == len(shape) and all(
        s is None or t.shape[i] == s for i, s in enumerate(shape))
    if not ok_shape or t.dtype not in dtypes:
        dims = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        names = "/".join(str(d).replace("torch.", "") for d in dtypes)
        raise ContractError(format_problem(op, arg, describe(t), f"a tensor of dtype {names} and shape {dims}", fix))
    if device is not None and t.device != device:
        raise ContractError(format_problem(op, arg, f"on {t.device}", f"on {device} like the other arguments",
                                           f"move {arg} to {device}"))


def _first_bad(mask: torch.Tensor) -> str:
    where = tuple(int(v) for v in mask.nonzero()[0])
    return f"{int(mask.sum())} bad entries, first at {list(where)}"


def _check_finite(op: str, arg: str, t: torch.Tensor) -> None:
    if not checks_values(t):
        return  # reading device memory would synchronize; see contract.checks_values
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        raise ContractError(format_problem(op, arg, f"not finite ({_first_bad(bad)})", "finite values",
                                           f"find where {arg} became NaN/Inf upstream; the gate cannot rank them"))
