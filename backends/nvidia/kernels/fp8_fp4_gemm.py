"""fp8_fp4_gemm_nt in Triton: D = C + A·Bᵀ with an e4m3 A and a packed E2M1 B (two codes per byte,
even element in the low nibble), both scaled per row along K (gran_k 32 or 128).

B's codes are widened in registers to e4m3 — every E2M1 value (0, ±0.5 … ±6) is exact in e4m3 —
so the product runs on the fp8 tensor-core path of Hopper; the K loop steps by the finer of the
two scale blocks and applies sa·sb to each block's partial product. Scales are read as stored
(fp32 any strides, or sm100 UE8M0 words).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import INTERPRET, dot, load_scales, serialized
from ._launch import autotuned, launch, m_bucket, pick_config
from ._tile import store_tile, tile_ids

OP = "fp8_fp4_gemm_nt"
#: K granularities of the operands' scales this kernel takes (DeepGEMM's mixed recipes)
GRAN_K = (32, 128)


@triton.jit
def e2m1_values(codes):
    """fp32 values of 4-bit E2M1 codes (int32): sign bit 3, magnitude index 0..7 -> 0, .5, 1, 1.5, 2, 3, 4, 6."""
    idx = codes & 7
    # index >= 2: (1 + m/2) * 2^e with e = idx//2 - 1, m = idx & 1; index 1: 0.5; index 0: 0
    normal = ((127 + (idx >> 1) - 1) << 23) | ((idx & 1) << 22)
    bits = tl.where(idx >= 2, normal, tl.where(idx == 1, 126 << 23, 0))
    bits = bits | ((codes & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def fp8_fp4_gemm_nt_kernel(a_ptr, b_ptr, d_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, M_BUCKET,
                           stride_am, stride_bn, stride_dm, stride_cm, stride_cn,
                           sa_stride_mn, sa_stride_k, sb_stride_mn, sb_stride_k,
                           SA_GRAN_K: tl.constexpr, SB_GRAN_K: tl.constexpr, SA_PACKED: tl.constexpr,
                           SB_PACKED: tl.constexpr, SA_MN_UNIT: tl.constexpr, SB_MN_UNIT: tl.constexpr,
                           BLOCK_K: tl.constexpr, HAS_C: tl.constexpr, OUT_BF16: tl.constexpr,
                           INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           GROUP_M: tl.constexpr):
    # MN-major scales with a compile-time unit stride load as vectors (as in fp8_gemm)
    if SA_MN_UNIT:
        sa_stride_mn = 1
    if SB_MN_UNIT:
        sb_stride_mn = 1
    pid_m, pid_n = tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rj = tl.arange(0, BLOCK_K // 2)
    mask_m = rm < M
    mask_n = rn < N
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :]
    b_ptrs = b_ptr + rn[:, None].to(tl.int64) * stride_bn + rj[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & (rk[None, :] < K - k0), other=0.0)
        packed = tl.load(b_ptrs, mask=mask_n[:, None] & (rj[None, :] < (K - k0) // 2), other=0).to(tl.int32)
        b = tl.reshape(tl.join(e2m1_values(packed & 0xF), e2m1_values(packed >> 4)), (BLOCK_N, BLOCK_K))
        partial = dot(a, tl.trans(b.to(tl.float8e4nv)), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), INTERPRET)
        sa = load_scales(sa_ptr, rm, k0 // SA_GRAN_K, sa_stride_mn, sa_stride_k, mask_m, SA_PACKED)
        sb = load_scales(sb_ptr, rn, k0 // SB_GRAN_K, sb_stride_mn, sb_stride_k, mask_n, SB_PACKED)
        acc += partial * sa[:, None] * sb[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K // 2
    store_tile(d_ptr, c_ptr, acc, rm, rn, mask_m[:, None] & mask_n[None, :], stride_dm, stride_cm, stride_cn,
               HAS_C, OUT_BF16, INTERPRET)


#: the first, the default for M > 64: on sm100 a 128-row tile's column scales sit in the accumulator's
#: layout (BLOCK_N / 2 per thread on 8 warps), and with K-major scale words each is a scalar load, so
#: 128x128 spills 304 B there (none with MN-major words); 128x64 fits both archs and both forms
CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "GROUP_M": 8}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 128, "GROUP_M": 1}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
]
_tuned = autotuned(fp8_fp4_gemm_nt_kernel, CONFIGS, key=["M_BUCKET", "N", "K", "SA_GRAN_K", "SB_GRAN_K",
                                                         "SA_PACKED", "SB_PACKED", "SA_MN_UNIT", "SB_MN_UNIT",
                                                         "HAS_C", "OUT_BF16"])


@serialized
def fp8_fp4_gemm_nt(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
                    c: torch.Tensor | None = None, *, gran_a: tuple[int, int] = (1, 128),
                    gran_b: tuple[int, int] = (1, 32), config: triton.Config | None = None) -> None:
    """D = C + A·Bᵀ written into d.

    a: e4m3 [M, K] K-major, per-row scales sfa (granularity (1, 32 or 128)); b: uint8 [N, K/2]
    packed E2M1 codes, per-row scales sfb (granularity (1, 32 or 128)); scale storage fp32 (any
    strides) or int32 sm100 words; d: bf16/fp32 [M, N] contiguous; c: None or [M, N].
    """
    _checks.tensor(OP, "a", a, (torch.float8_e4m3fn,), (None, None))
    m, k = a.shape
    device = a.device
    if k < 2 or k % 2:
        _checks.fail(OP, "a", f"with K = {k}", "an even K >= 2 (two FP4 codes per byte of b)", "pad K to even")
    _checks.tensor(OP, "b", b, (torch.uint8, torch.int8), (None, k // 2), device)
    n = b.shape[0]
    _checks.inner_contiguous(OP, "a", a)
    _checks.inner_contiguous(OP, "b", b)
    for arg, gran in (("gran_a", gran_a), ("gran_b", gran_b)):
        if gran[0] != 1 or gran[1] not in GRAN_K:
            _checks.fail(OP, arg, gran, f"(1, gran_k) with gran_k in {GRAN_K}", "quantize per token")
    _checks.scale_storage(OP, "sfa", sfa, m, k, gran_a, device)
    _checks.scale_storage(OP, "sfb", sfb, n, k, gran_b, device)
    _checks.gemm_output(OP, d, c, (m, n), device)
    if m == 0 or n == 0:
        return
    c_arg = c if c is not None else d
    args = (a, b.view(torch.uint8), d, c_arg, sfa, sfb, m, n, k, m_bucket(m), a.stride(0), b.stride(0), d.stride(0),
            c_arg.stride(0), c_arg.stride(1), sfa.stride(0), sfa.stride(1), sfb.stride(0), sfb.stride(1))
    constants = dict(SA_GRAN_K=gran_a[1], SB_GRAN_K=gran_b[1], SA_PACKED=sfa.dtype == torch.int32,
                     SB_PACKED=sfb.dtype == torch.int32, SA_MN_UNIT=sfa.stride(0) == 1,
                     SB_MN_UNIT=sfb.stride(0) == 1, BLOCK_K=min(gran_a[1], gran_b[1]), HAS_C=c is not None,
                     OUT_BF16=d.dtype == torch.bfloat16, INTERPRET=INTERPRET)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    launch(fp8_fp4_gemm_nt_kernel, _tuned, grid, args, constants, config, pick_config(CONFIGS, m))
