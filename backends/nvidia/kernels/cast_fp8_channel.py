"""per_channel_cast_to_fp8 in Triton: x [(G,) K, N] quantized per (gran_k rows, 1 column).

One program holds one block of gran_k rows by BLOCK_N columns (N contiguous, so every row of the
tile is one coalesced load) and takes each column's amax down the rows: amax clamped to >= 1e-4,
sf = amax / 448 (rounded up to a power of two with use_ue8m0), q = clamp(x / sf, ±448) as e4m3,
ties to even; with multiply_by_inverse (the "deep_gemm" convention) q = clamp(x * (1 / sf), ±448).
Divisions are IEEE-exact (div_rn) and the interpreter's casts go through the bit-exact helpers of
_common, so codes and scales equal the contract's torch reference byte for byte. Scales are the
plain fp32 [(G,) ceil(K/gran_k), N] (the K-grouped GEMMs take them as they are).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portable_kernels.layouts.constants import FP8_E4M3_MAX, SCALE_AMAX_FLOOR

from . import _checks
from ._common import INTERPRET, block_scale, e4m3_codes, serialized

OP = "per_channel_cast_to_fp8"
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: most rows of one block one program holds in registers
MAX_GRAN_K = 128
#: columns per program: 64 keeps a 128-row tile at 64 fp32 per thread on 4 warps; the interpreter
#: runs each program as numpy calls, so fewer, wider programs are much faster there
BLOCK_N = 256 if INTERPRET else 64
NUM_WARPS = 4


@triton.jit
def cast_fp8_channel_kernel(x_ptr, q_ptr, sf_ptr, K, N, stride_xg, stride_xk, stride_qg, stride_qk, stride_sg,
                            stride_sk, GRAN_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                            UE8M0: tl.constexpr, AMAX_FLOOR: tl.constexpr, FP8_MAX: tl.constexpr,
                            MUL_INV: tl.constexpr, INTERPRET: tl.constexpr):
    kb = tl.program_id(0)
    pid_n = tl.program_id(1)
    group = tl.program_id(2).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    rows = kb * GRAN_K + rk
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = ((rows < K) & (rk < GRAN_K))[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + group * stride_xg + rows[:, None].to(tl.int64) * stride_xk + cols[None, :], mask=mask,
                other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    has_nan = tl.max((x != x).to(tl.int32), axis=0)
    nonfinite = tl.maximum(has_nan, tl.max((tl.abs(x) == float("inf")).to(tl.int32), axis=0))
    amax = tl.where(has_nan > 0, float("nan"), amax)  # tl.max may drop NaN; the reference's amax keeps it
    sf = block_scale(amax, nonfinite, AMAX_FLOOR, FP8_MAX, UE8M0)
    if MUL_INV:  # x * (1 / sf): the reciprocal rounded once, then the product rounded once
        scaled = x * tl.math.div_rn(tl.full(sf.shape, 1.0, tl.float32), sf)[None, :]
    else:
        scaled = tl.math.div_rn(x, sf[None, :])
    q = tl.clamp(scaled, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    tl.store(q_ptr + group * stride_qg + rows[:, None].to(tl.int64) * stride_qk + cols[None, :],
             e4m3_codes(q, INTERPRET), mask=mask)
    tl.store(sf_ptr + group * stride_sg + kb * stride_sk + cols, sf, mask=col_mask)


@serialized
def per_channel_cast_to_fp8(x: torch.Tensor, gran_k: int, use_ue8m0: bool,
                            multiply_by_inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16/fp16/fp32 [(G,) K, N] (N contiguous) -> (e4m3 [(G,) K, N], fp32 [(G,) ceil(K/gran_k), N]).

    gran_k: rows per scale block, 1..128. multiply_by_inverse: q = x * (1 / sf) (DeepGEMM's
    rounding) instead of x / sf.
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in INPUT_DTYPES or x.dim() not in (2, 3):
        _checks.fail(OP, "x", repr(x) if not isinstance(x, torch.Tensor) else f"{x.dtype} {tuple(x.shape)}",
                     f"a 2-D or 3-D tensor of dtype {INPUT_DTYPES}", "pass [(G,) K, N] values")
    if isinstance(gran_k, bool) or not isinstance(gran_k, int) or not 1 <= gran_k <= MAX_GRAN_K:
        _checks.fail(OP, "gran_k", repr(gran_k), f"an int in [1, {MAX_GRAN_K}]", "use 128 (the DeepGEMM recipe)")
    for arg, value in (("use_ue8m0", use_ue8m0), ("multiply_by_inverse", multiply_by_inverse)):
        if not isinstance(value, bool):
            _checks.fail(OP, arg, repr(value), "a bool", "pass True or False")
    _checks.inner_contiguous(OP, "x", x)
    lead, (k, n) = tuple(x.shape[:-2]), x.shape[-2:]
    k_blocks = -(-k // gran_k)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    sf = torch.empty(*lead, k_blocks, n, dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return q, sf
    x3, q3, sf3 = (x, q, sf) if lead else (x[None], q[None], sf[None])
    grid = (k_blocks, triton.cdiv(n, BLOCK_N), x3.shape[0])
    cast_fp8_channel_kernel[grid](x3, q3.view(torch.uint8), sf3, k, n, x3.stride(0), x3.stride(1), q3.stride(0),
                                  q3.stride(1), sf3.stride(0), sf3.stride(1), GRAN_K=gran_k,
                                  BLOCK_K=triton.next_power_of_2(gran_k), BLOCK_N=BLOCK_N, UE8M0=use_ue8m0,
                                  AMAX_FLOOR=SCALE_AMAX_FLOOR, FP8_MAX=FP8_E4M3_MAX, MUL_INV=multiply_by_inverse,
                                  INTERPRET=INTERPRET, num_warps=NUM_WARPS)
    return q, sf
