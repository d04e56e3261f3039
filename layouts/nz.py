"""Ascend FRACTAL_NZ: a matrix stored as tiles of 16 rows x 32 bytes for the cube unit.

Rule: ND -> NZ is a pure byte move with zero padding; NZ -> ND strips the padding. Works for every
dtype whose size divides 32 bytes (fp8/int8/uint8 C0 = 32, bf16/fp16 C0 = 16, fp32 C0 = 8).

An ND matrix [..., M, N] becomes [..., ceil(N/C0), ceil(M/16), 16, C0]: element (i, j) goes to
[j // C0, i // 16, i % 16, j % C0]. Example M = 3, N = 4 with C0 = 2 (for illustration)::

    ND  a b c d       NZ tile 0 (columns 0-1)   tile 1 (columns 2-3)
        e f g h          a b                       c d
        i j k l          e f                       g h
                         i j                       k l
                         0 0  (x13 zero rows)      0 0 ...

An FP8 weight [N, K] (N a multiple of 16) in NZ is therefore [K/32][N][32] bytes. torch_npu calls
this format id 29 (ACL_FORMAT_FRACTAL_NZ); DeepGEMM-Ascend keeps plain GEMM operands ND and uses
NZ for the fused MoE path and for torch_npu operators that prefer NZ weights.
"""

from __future__ import annotations

import torch

from ._util import as_int_bits, ceil_div
from .constants import NZ_FRACTAL_BYTES, NZ_FRACTAL_ROWS
from .errors import LayoutConversionError

__all__ = ["nz_c0", "nz_shape", "nd_to_nz", "nz_to_nd"]

_ELEMENT_SIZES = (1, 2, 4)  # the cube unit's operand widths: fp8/int8, bf16/fp16, fp32


def nz_c0(dtype: torch.dtype) -> int:
    """Columns per NZ tile: 32 bytes / itemsize (fp8/int8 32, bf16/fp16 16, fp32 8)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    if itemsize not in _ELEMENT_SIZES:
        raise LayoutConversionError(f"FRACTAL_NZ takes 1-, 2- or 4-byte elements, got {dtype} ({itemsize} bytes)")
    return NZ_FRACTAL_BYTES // itemsize


def nz_shape(m: int, n: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """NZ shape of an [M, N] matrix: (ceil(N/C0), ceil(M/16), 16, C0)."""
    c0 = nz_c0(dtype)
    return (ceil_div(n, c0), ceil_div(m, NZ_FRACTAL_ROWS), NZ_FRACTAL_ROWS, c0)


def _as_units(x: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """View `x` in the widest integer unit (8, 4, 2 or 1 bytes) that divides a row and that its strides allow.

    Moving 32-byte tile rows as four int64 instead of 32 bytes makes the copies several times faster;
    the bytes are the same.
    """
    for unit in (torch.int64, torch.int32, torch.int16):
        size = torch.empty((), dtype=unit).element_size()
        if size <= x.element_size() or row_bytes % size:
            continue
        try:
            return x.view(unit)
        except RuntimeError:  # last dim not contiguous, or an offset/stride not a multiple of the unit
            continue
    return as_int_bits(x)


def nd_to_nz(x: torch.Tensor) -> torch.Tensor:
    """ND `[..., M, N]` -> NZ `[..., ceil(N/C0), ceil(M/16), 16, C0]`, contiguous, padding zero."""
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise LayoutConversionError("nd_to_nz expects a tensor [..., M, N] with at least 2 dims")
    *lead, m, n = x.shape
    n1, m1, rows, c0 = nz_shape(m, n, x.dtype)
    units = _as_units(x, n * x.element_size())
    unit_size = units.element_size()
    cw, nw = NZ_FRACTAL_BYTES // unit_size, n * x.element_size() // unit_size  # tile width, row width in units
    out = torch.empty((*lead, n1, m1 * rows, cw), dtype=units.dtype, device=x.device)
    out[..., m:, :].zero_()
    full, rest = divmod(nw, cw)
    if full:
        src = units[..., : full * cw].unflatten(-1, (full, cw)).transpose(-3, -2)  # [..., full, M, cw]
        out[..., :full, :m, :].copy_(src)
    if rest:
        out[..., full, :m, :rest].copy_(units[..., full * cw :])
        out[..., full, :m, rest:].zero_()
    return out.view(x.dtype).view(*lead, n1, m1, rows, c0)


def nz_to_nd(x: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """NZ `[..., ceil(N/C0), ceil(M/16), 16, C0]` -> contiguous ND `[..., M, N]`; padding is dropped unread."""
    if not isinstance(x, torch.Tensor) or x.dim() < 4:
        raise LayoutConversionError("nz_to_nd expects an NZ tensor [..., ceil(N/C0), ceil(M/16), 16, C0]")
    for name, v in (("m", m), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise LayoutConversionError(f"{name} must be an int >= 0, got {v!r}")
    expected = nz_shape(m, n, x.dtype)
    if tuple(x.shape[-4:]) != expected:
        raise LayoutConversionError(
            f"NZ tensor has trailing shape {tuple(x.shape[-4:])} but M={m}, N={n}, dtype {x.dtype} need {expected}"
        )
    *lead, n1, m1, rows, c0 = x.shape
    src = _as_units(x, n * x.element_size())
    cw = src.shape[-1]
    src = src.reshape(*lead, n1, m1 * rows, cw)
    nw = n * x.element_size() // src.element_size()
    out = torch.empty((*lead, m, nw), dtype=src.dtype, device=x.device)
    full, rest = divmod(nw, cw)
    if full:
        out[..., : full * cw].unflatten(-1, (full, cw)).copy_(src[..., :full, :m, :].transpose(-3, -2))
    if rest:
        out[..., full * cw :].copy_(src[..., full, :m, :rest])
    return out.view(x.dtype)
