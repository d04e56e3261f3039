"""Argument checks shared by the ops: each raises a ContractError naming the op, the argument,
what was given, what was expected and the fix (`errors.format_problem`).

Checks that read tensor values on the host (NaN, index ranges) run only where `checks_values`
allows: always on CPU tensors, on accelerators only with PK_CHECK_VALUES=1 (each costs a sync).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .contract import checks_values
from .errors import ContractError, format_problem
from .tensors import describe

__all__ = ["check_allocation", "check_bool", "check_device", "device_capacity_bytes", "check_finite", "check_int", "check_tensor", "checks_values", "first_bad",
           "is_int", "fail", "contiguous", "inner_contiguous"]


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_bool(op: str, arg: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ContractError(format_problem(op, arg, repr(value), "a bool", f"pass {arg}=True or {arg}=False"))


def check_int(op: str, arg: str, value: Any, low: int | None = None, high: int | None = None,
              fix: str | None = None) -> None:
    """`value` is an int (not a bool) in [low, high] (either bound may be None)."""
    if not is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        if low == 1 and high is None:
            want = "a positive int"
        elif high is None:
            want = "an int" if low is None else f"an int >= {low}"
        else:
            want = f"an int in [{low}, {high}]"
        raise ContractError(format_problem(op, arg, repr(value), want, fix or f"pass {want}"))


def check_tensor(op: str, arg: str, t: Any, dtypes: tuple[torch.dtype, ...], shape: tuple[int | None, ...],
                 device: torch.device | None = None, fix: str = "") -> None:
    """A tensor of one of `dtypes` with len(shape) dims, each fixed size matching (None: any), on `device`."""
    ok_shape = isinstance(t, torch.Tensor) and t.dim() == len(shape) and all(
        s is None or t.shape[i] == s for i, s in enumerate(shape))
    if not ok_shape or t.dtype not in dtypes:
        dims = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        names = "/".join(str(d).replace("torch.", "") for d in dtypes)
        raise ContractError(format_problem(op, arg, describe(t), f"a tensor of dtype {names} and shape {dims}",
                                           fix or f"pass {arg} as {names} {dims}"))
    if device is not None and t.device != device:  # the call only on the error path (kernels check per launch)
        check_device(op, arg, t, device)


def check_device(op: str, arg: str, t: torch.Tensor | None, device: torch.device, like: str = "the operands") -> None:
    if t is not None and t.device != device:
        raise ContractError(format_problem(op, arg, f"on {t.device}", f"on {device} like {like}",
                                           f"move {arg} to {device}"))


def device_capacity_bytes(device: torch.device) -> int | None:
    """The memory a device holds (CPU: physical RAM; CUDA: the GPU's total memory), None if unknown."""
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).total_memory
    return None


def check_allocation(op: str, arg: str, numel: int, itemsize: int, device: torch.device, fix: str) -> None:
    """Refuse, before allocating, a size argument that would need more memory than the device holds."""
    need = numel * itemsize
    capacity = device_capacity_bytes(device)
    if capacity is not None and need > capacity:
        raise ContractError(format_problem(op, arg, f"a size needing {need / 2**30:.3g} GiB",
                                           f"at most the {capacity / 2**30:.3g} GiB {device} holds", fix))


def first_bad(mask: torch.Tensor) -> str:
    """'N bad entries, first at [i, j]' for a boolean mask with at least one True."""
    where = tuple(int(v) for v in mask.nonzero()[0])
    return f"{int(mask.sum())} bad entries, first at {list(where)}"


def check_finite(op: str, arg: str, t: torch.Tensor, fix: str | None = None) -> None:
    """No NaN/Inf in `t` (where values may be read; see checks_values)."""
    if not checks_values(t):
        return  # reading device memory would synchronize
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        raise ContractError(format_problem(op, arg, f"not finite ({first_bad(bad)})", "finite values",
                                           fix or f"find where {arg} became NaN/Inf upstream"))


# -- kernel-side checks: what a launch re-checks to protect a native pointer read ----------------------


def fail(op: str, arg: str, given: object, expected: object, fix: str) -> None:
    """Raise the ContractError naming op, argument, what was given, what was expected and the fix."""
    raise ContractError(format_problem(op, arg, given, expected, fix))


def contiguous(op: str, arg: str, t: torch.Tensor) -> torch.Tensor:
    """t is contiguous (a native kernel walks it with its logical strides); returns it."""
    if not t.is_contiguous():
        fail(op, arg, f"non-contiguous (strides {t.stride()})", "a contiguous tensor", f"pass {arg}.contiguous()")
    return t


def inner_contiguous(op: str, arg: str, t: torch.Tensor) -> None:
    """The last dim is contiguous (K-major operands, row-major outputs)."""
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(op, arg, f"with strides {t.stride()}", "stride(-1) == 1 (K-major / row-major)",
             f"pass {arg}.contiguous()")

