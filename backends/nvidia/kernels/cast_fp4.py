"""per_token_cast_to_fp4 in Triton: E2M1 codes packed two per byte (even element in the low
nibble) with per (1, gran_k) scales written in the consumer's format.

Per block: amax clamped to >= 1e-4, sf = amax / 6 (rounded up to a power of two with use_ue8m0),
code = E2M1 of x / sf, nearest with ties to the even code, |x / sf| > 6 saturating to 6, the sign
bit following the sign of x / sf (so negative values rounding to 0 give code 0x8), exactly as
layouts.e2m1_encode does. convention "deep_gemm" is DeepGEMM's rounding instead: code = E2M1 of
x * (1 / sf) (the reciprocal and the product each rounded once), the magnitude index counting the
midpoints strictly below it (every tie toward zero, above 5 -> 6), and the sign bit only on a
non-zero magnitude (so -0 and tiny negatives give +0), as layouts.e2m1_encode_ties_toward_zero does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portable_kernels.layouts.constants import FP4_E2M1_MAX, SCALE_AMAX_FLOOR

from typing import Literal

from . import _checks
from ._common import ceil_ue8m0, serialized
from ._scale_out import ScaleForm, scale_out, store_scales
from .cast_fp8 import INPUT_DTYPES, MAX_BLOCK, TOKEN_ROWS, check_form

OP = "per_token_cast_to_fp4"
#: the rounding rules: "portable" (x / sf, ties to even, sign kept) and DeepGEMM's
CONVENTIONS = ("portable", "deep_gemm")
Convention = Literal["portable", "deep_gemm"]


@triton.jit
def e2m1_codes(v):
    """E2M1 codes (int32 0..15) of fp32 `v`: ties to the even code, saturating at 6, sign bit 3."""
    bits = v.to(tl.int32, bitcast=True)
    mag = tl.minimum(tl.abs(v), 6.0)
    mbits = mag.to(tl.int32, bitcast=True)
    # |v| >= 1: index = fp32 exponent and top mantissa bit, mantissa rounded to one bit (ties to even)
    index = ((mbits + 0x1FFFFF + ((mbits >> 22) & 1)) >> 22) - 252
    # |v| < 1: grid 0, 0.5, 1 -> the FPU rounds 2|v| + 2^23 to an integer, half to even
    small = (mag * 2.0 + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
    index = tl.where(mag < 1.0, small, index)
    return index | ((bits >> 28) & 8)


@triton.jit
def e2m1_codes_ties_toward_zero(v):
    """E2M1 codes (int32 0..15) of fp32 `v` by DeepGEMM's rule: the number of midpoints (0.25, 0.75,
    1.25, 1.75, 2.5, 3.5, 5) strictly below |v|, sign bit 3 only for a non-zero magnitude."""
    mag = tl.abs(v)
    index = ((mag > 0.25).to(tl.int32) + (mag > 0.75).to(tl.int32) + (mag > 1.25).to(tl.int32)
             + (mag > 1.75).to(tl.int32) + (mag > 2.5).to(tl.int32) + (mag > 3.5).to(tl.int32)
             + (mag > 5.0).to(tl.int32))
    return index | tl.where((v < 0.0) & (index != 0), 8, 0)


@triton.jit
def cast_fp4_kernel(x_ptr, q_ptr, sf_ptr, ROWS, K, stride_xg, stride_xr, stride_qg, stride_qr,
                    sf_stride_g, sf_stride_row, sf_stride_k, GRAN_K: tl.constexpr, BLOCK_R: tl.constexpr,
                    HALF_K: tl.constexpr, UE8M0: tl.constexpr, SF_KIND: tl.constexpr, AMAX_FLOOR: tl.constexpr,
                    FP4_MAX: tl.constexpr, DEEP_GEMM: tl.constexpr):
    pid_r = tl.program_id(0)
    kb = tl.program_id(1)
    group = tl.program_id(2)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    pair = tl.arange(0, HALF_K)
    row_mask = rows < ROWS
    # element pairs (2j, 2j + 1) of the block; a pair is whole or absent (K and GRAN_K are even)
    col = kb * GRAN_K + 2 * pair
    pmask = row_mask[:, None] & (col[None, :] < K) & (2 * pair[None, :] < GRAN_K)
    base = x_ptr + group.to(tl.int64) * stride_xg + rows[:, None].to(tl.int64) * stride_xr + col[None, :]
    even = tl.load(base, mask=pmask, other=0.0).to(tl.float32)
    odd = tl.load(base + 1, mask=pmask, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(even), axis=1), tl.max(tl.abs(odd), axis=1))
    amax = tl.maximum(amax, AMAX_FLOOR)
    if UE8M0:
        sf = ceil_ue8m0(tl.math.div_rn(amax, FP4_MAX))
    else:
        sf = tl.math.div_rn(amax, FP4_MAX)
    if DEEP_GEMM:  # x * (1 / sf), ties toward zero, zero as +0
        inv = tl.math.div_rn(tl.full(sf.shape, 1.0, tl.float32), sf)[:, None]
        lo = e2m1_codes_ties_toward_zero(even * inv)
        hi = e2m1_codes_ties_toward_zero(odd * inv)
    else:
        lo = e2m1_codes(tl.math.div_rn(even, sf[:, None]))
        hi = e2m1_codes(tl.math.div_rn(odd, sf[:, None]))
    q = q_ptr + group.to(tl.int64) * stride_qg + rows[:, None].to(tl.int64) * stride_qr + (col[None, :] // 2)
    tl.store(q, (lo | (hi << 4)).to(tl.uint8), mask=pmask)
    store_scales(sf_ptr + group.to(tl.int64) * sf_stride_g, sf, rows, row_mask, kb, sf_stride_row, sf_stride_k,
                 SF_KIND, 1)


@serialized
def cast_to_fp4(x: torch.Tensor, gran_k: int, use_ue8m0: bool, scale_form: ScaleForm = "plain",
                convention: Convention = "portable") -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16/fp16/fp32 [(G,) M, K] (K even, finite) -> (uint8 [(G,) M, K/2] packed E2M1, scales).

    gran_k: an even block size in [2, 128]; scales (1, gran_k) in `scale_form`; convention: the
    rounding rule, "portable" or "deep_gemm" (see the module docstring).
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in INPUT_DTYPES or x.dim() not in (2, 3):
        _checks.fail(OP, "x", repr(x) if not isinstance(x, torch.Tensor) else f"{x.dtype} {tuple(x.shape)}",
                     f"a 2-D or 3-D tensor of dtype {INPUT_DTYPES}", "pass [(G,) rows, K] values")
    if x.shape[-1] % 2:
        _checks.fail(OP, "x", f"with odd K = {x.shape[-1]}", "an even K", "pad K to an even length")
    if isinstance(gran_k, bool) or not isinstance(gran_k, int) or gran_k % 2 or not 2 <= gran_k <= MAX_BLOCK:
        _checks.fail(OP, "gran_k", repr(gran_k), f"an even int in [2, {MAX_BLOCK}]", "use 32 (MX) or 128")
    check_form(OP, scale_form, use_ue8m0)
    if convention not in CONVENTIONS:
        _checks.fail(OP, "convention", repr(convention), f"one of {CONVENTIONS}", "pass 'portable' or 'deep_gemm'")
    _checks.inner_contiguous(OP, "x", x)
    lead, (rows, k) = tuple(x.shape[:-2]), x.shape[-2:]
    k_blocks = -(-k // gran_k)
    q = torch.empty(*lead, rows, k // 2, dtype=torch.uint8, device=x.device)
    out = scale_out(scale_form, lead, rows, k_blocks, 1, x.device)
    if x.numel() == 0:
        return q, out.result
    x3, q3 = x.reshape(-1, rows, k) if lead else x[None], q.view(-1, rows, k // 2)
    grid = (triton.cdiv(rows, TOKEN_ROWS), k_blocks, x3.shape[0])
    cast_fp4_kernel[grid](x3, q3, out.target, rows, k, x3.stride(0), x3.stride(1), q3.stride(0), q3.stride(1),
                          out.stride_g, out.stride_row, out.stride_k, GRAN_K=gran_k, BLOCK_R=TOKEN_ROWS,
                          HALF_K=triton.next_power_of_2(gran_k // 2), UE8M0=use_ue8m0, SF_KIND=out.kind,
                          AMAX_FLOOR=SCALE_AMAX_FLOOR, FP4_MAX=FP4_E2M1_MAX, DEEP_GEMM=convention == "deep_gemm")
    return q, out.result
