"""Argument checks the launch functions run before any kernel starts (no Triton import here).

A kernel must never read or write out of bounds, so every launcher checks dtypes, shapes, strides,
devices and block sizes first and raises ContractError naming the argument and the fix.
"""

from __future__ import annotations

from typing import Any

import torch

from portable_kernels.core.checks import check_tensor, contiguous, fail, inner_contiguous

__all__ = ["GEMM_BLOCK_K", "block_k", "contiguous", "fail", "gemm_output", "inner_contiguous", "scale_storage",
           "tensor"]

#: K block sizes (scale granularity along K) the GEMM kernels tile with: powers of two
GEMM_BLOCK_K = (16, 32, 64, 128, 256)


#: t is a tensor of one of `dtypes`, of `shape` (None = any size), on `device`
tensor = check_tensor


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
