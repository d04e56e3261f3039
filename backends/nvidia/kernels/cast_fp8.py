"""per_token_cast_to_fp8 / per_block_cast_to_fp8 in Triton, writing the consumer's scale format.

One program quantizes one K-block of BLOCK_R rows (per token: gran_mn = 1) or one whole
gran_mn x gran_k block (per block): amax clamped to >= 1e-4, sf = amax / 448 (rounded up to a
power of two with use_ue8m0), q = clamp(x / sf, ±448) as e4m3, round to nearest even; with
multiply_by_inverse (the "deep_gemm" convention) q = clamp(x * (1 / sf), ±448) instead. Divisions
are IEEE-exact (div_rn), so scales and codes equal the contract's torch reference bit for bit.
Scales go straight into the requested storage (_scale_out): plain, sm90 or sm100.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portable_kernels.layouts.constants import FP8_E4M3_MAX, SCALE_AMAX_FLOOR

from . import _checks
from ._common import INTERPRET, block_scale, e4m3_codes, nonfinite_rows, serialized
from ._scale_out import SCALE_FORMS, ScaleForm, scale_out, store_scales

OPS = {True: "per_token_cast_to_fp8", False: "per_block_cast_to_fp8"}
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: largest block edge one program holds in registers
MAX_BLOCK = 128
#: rows per program for per-token casts: 16 keeps a GPU program's tile in registers; the
#: interpreter runs each program as numpy calls, so fewer, larger programs are much faster there
TOKEN_ROWS = 64 if INTERPRET else 16


@triton.jit
def cast_fp8_kernel(x_ptr, q_ptr, sf_ptr, ROWS, K, stride_xg, stride_xr, stride_qg, stride_qr,
                    sf_stride_g, sf_stride_row, sf_stride_k, GRAN_MN: tl.constexpr, GRAN_K: tl.constexpr,
                    ROWS_PER_PROGRAM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                    UE8M0: tl.constexpr, SF_KIND: tl.constexpr, AMAX_FLOOR: tl.constexpr, FP8_MAX: tl.constexpr,
                    MUL_INV: tl.constexpr, INTERPRET: tl.constexpr):
    pid_r = tl.program_id(0)
    kb = tl.program_id(1)
    group = tl.program_id(2)
    rows = pid_r * ROWS_PER_PROGRAM + tl.arange(0, BLOCK_R)
    cols = kb * GRAN_K + tl.arange(0, BLOCK_K)
    row_mask = (rows < ROWS) & (tl.arange(0, BLOCK_R) < ROWS_PER_PROGRAM)
    mask = row_mask[:, None] & (cols[None, :] < K) & (tl.arange(0, BLOCK_K)[None, :] < GRAN_K)
    x = tl.load(x_ptr + group.to(tl.int64) * stride_xg + rows[:, None].to(tl.int64) * stride_xr + cols[None, :],
                mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    has_nan, nonfinite = nonfinite_rows(x)
    if GRAN_MN > 1:  # the program holds exactly one block of GRAN_MN rows
        amax = tl.zeros_like(amax) + tl.max(amax, axis=0)
        has_nan = tl.zeros_like(has_nan) + tl.max(has_nan, axis=0)
        nonfinite = tl.zeros_like(nonfinite) + tl.max(nonfinite, axis=0)
    amax = tl.where(has_nan > 0, float("nan"), amax)
    sf = block_scale(amax, nonfinite, AMAX_FLOOR, FP8_MAX, UE8M0)
    if MUL_INV:  # x * (1 / sf): the reciprocal rounded once, then the product rounded once
        scaled = x * tl.math.div_rn(tl.full(sf.shape, 1.0, tl.float32), sf)[:, None]
    else:
        scaled = tl.math.div_rn(x, sf[:, None])
    q = tl.clamp(scaled, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    tl.store(q_ptr + group.to(tl.int64) * stride_qg + rows[:, None].to(tl.int64) * stride_qr + cols[None, :],
             e4m3_codes(q, INTERPRET), mask=mask)
    store_scales(sf_ptr + group.to(tl.int64) * sf_stride_g, sf, rows, row_mask, kb, sf_stride_row, sf_stride_k,
                 SF_KIND, GRAN_MN)


def check_form(op: str, form: str, use_ue8m0: bool) -> None:
    if form not in SCALE_FORMS:
        _checks.fail(op, "scale_form", repr(form), f"one of {SCALE_FORMS}", "pass 'plain', 'sm90' or 'sm100'")
    if form == "sm100" and not use_ue8m0:
        _checks.fail(op, "use_ue8m0", "False with sm100 scales", "True (sm100 stores exponents only)",
                     "quantize with use_ue8m0=True")


@serialized
def cast_to_fp8(x: torch.Tensor, granularity: tuple[int, int], use_ue8m0: bool,
                scale_form: ScaleForm = "plain", multiply_by_inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16/fp16/fp32 [(G,) MN, K] -> (e4m3 [(G,) MN, K], scales in `scale_form`).

    granularity (gran_mn, gran_k): (1, gk) per token or (gm, gk) per block, each at most 128.
    multiply_by_inverse: q = x * (1 / sf) (DeepGEMM's rounding) instead of x / sf.
    """
    gm, gk = granularity
    op = OPS[gm == 1]
    if not isinstance(x, torch.Tensor) or x.dtype not in INPUT_DTYPES or x.dim() not in (2, 3):
        _checks.fail(op, "x", repr(x) if not isinstance(x, torch.Tensor) else f"{x.dtype} {tuple(x.shape)}",
                     f"a 2-D or 3-D tensor of dtype {INPUT_DTYPES}", "pass [(G,) rows, K] activations or weights")
    for arg, value in (("gran_mn", gm), ("gran_k", gk)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BLOCK:
            _checks.fail(op, arg, repr(value), f"an int in [1, {MAX_BLOCK}]", "use 128 (the DeepGEMM recipe)")
    check_form(op, scale_form, use_ue8m0)
    if not isinstance(multiply_by_inverse, bool):
        _checks.fail(op, "multiply_by_inverse", repr(multiply_by_inverse), "a bool", "pass True or False")
    _checks.inner_contiguous(op, "x", x)
    lead, (rows, k) = tuple(x.shape[:-2]), x.shape[-2:]
    k_blocks = -(-k // gk)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    out = scale_out(scale_form, lead, rows, k_blocks, gm, x.device)
    if x.numel() == 0:
        return q, out.result
    x3, q3 = x.reshape(-1, rows, k) if lead else x[None], q.view(-1, rows, k)
    groups = x3.shape[0]
    per_program = TOKEN_ROWS if gm == 1 else gm
    grid = (triton.cdiv(rows, per_program), k_blocks, groups)
    cast_fp8_kernel[grid](x3, q3.view(torch.uint8), out.target, rows, k, x3.stride(0), x3.stride(1),
                          q3.stride(0), q3.stride(1), out.stride_g, out.stride_row, out.stride_k,
                          GRAN_MN=gm, GRAN_K=gk, ROWS_PER_PROGRAM=per_program,
                          BLOCK_R=triton.next_power_of_2(per_program), BLOCK_K=triton.next_power_of_2(gk),
                          UE8M0=use_ue8m0, SF_KIND=out.kind, AMAX_FLOOR=SCALE_AMAX_FLOOR, FP8_MAX=FP8_E4M3_MAX,
                          MUL_INV=multiply_by_inverse, INTERPRET=INTERPRET)
    return q, out.result
