"""Argument checks the launch functions run before any kernel starts (no Triton import here).

A kernel must never read or write out of bounds, so every launcher checks dtypes, shapes, strides,
devices and block sizes first and raises ContractError naming the argument and the fix.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from portable_kernels.core.errors import ContractError, format_problem

#: K block sizes (scale granularity along K) the GEMM kernels tile with: powers of two
GEMM_BLOCK_K = (16, 32, 64, 128, 256)


def fail(op: str, arg: str, given: object, expected: object, fix: str) -> None:
    raise ContractError(format_problem(op, arg, given, expected, fix))


def tensor(op: str, arg: str, t: Any, dtypes: Sequence[torch.dtype], shape: Sequence[int | None],
           device: torch.device | None = None) -> None:
    """t is a tensor of one of `dtypes`, of `shape` (None = any size), on `device`."""
    if not isinstance(t, torch.Tensor) or t.dtype not in tuple(dtypes):
        fail(op, arg, repr(t) if not isinstance(t, torch.Tensor) else f"of dtype {t.dtype}",
             f"a tensor of dtype {tuple(dtypes)}", f"pass {arg} with one of those dtypes")
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
        fail(op, arg, f"of shape {tuple(t.shape)}", f"shape {list(shape)} (None = any)", f"pass {arg} with that shape")
    if device is not None and t.device != device:
        fail(op, arg, f"on {t.device}", f"on {device}", f"move {arg} to {device}")


def inner_contiguous(op: str, arg: str, t: torch.Tensor) -> None:
    """The last dim is contiguous (K-major operands, row-major outputs)."""
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(op, arg, f"with strides {t.stride()}", "stride(-1) == 1 (K-major / row-major)",
             f"pass {arg}.contiguous()")


def contiguous(op: str, arg: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        fail(op, arg, f"non-contiguous (strides {t.stride()})", "a contiguous tensor", f"pass {arg}.contiguous()")


def block_k(op: str, arg: str, gran_k: int) -> None:
    if gran_k not in GEMM_BLOCK_K:
        fail(op, arg, f"scaled per {gran_k} along K", f"a K granularity in {GEMM_BLOCK_K}",
             "quantize with gran_k=128 (the Triton kernels tile K by the scale block)")


def scale_storage(op: str, arg: str, sf: Any, rows: int, k: int, granularity: tuple[int, int],
                  device: torch.device, groups: int | None = None) -> None:
    """sf is fp32 [(G,) ceil(rows/gm), ceil(K/gk)] with any strides (sm90 or plain), or int32
    [(G,) rows, ceil(ceil(K/gk)/4)] UE8M0 words (sm100, per-row scales only)."""
    gm, gk = granularity
    lead = () if groups is None else (groups,)
    kb = -(-k // gk)
    if isinstance(sf, torch.Tensor) and sf.dtype == torch.int32:
        if gm != 1:
            fail(op, arg, f"packed UE8M0 words with granularity {granularity}", "per-row scales (1, gran_k)",
                 "prepare the operand for arch='sm100' (its scales are per row)")
        tensor(op, arg, sf, (torch.int32,), (*lead, rows, -(-kb // 4)), device)
    else:
        tensor(op, arg, sf, (torch.float32,), (*lead, -(-rows // gm), kb), device)


def gemm_output(op: str, d: Any, c: Any, shape: tuple[int, ...], device: torch.device) -> None:
    """d: bf16/fp32 contiguous of `shape`; c: None or fp32 (or d's dtype) of `shape` (any strides)."""
    tensor(op, "d", d, (torch.bfloat16, torch.float32), shape, device)
    contiguous(op, "d", d)
    if c is not None:
        tensor(op, "c", c, (torch.float32, d.dtype), shape, device)
