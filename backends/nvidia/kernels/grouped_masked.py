"""m_grouped_{fp8,bf16}_gemm_nt_masked in Triton: A [G, max_m, K], B [G, N, K], D [G, max_m, N];
only the first masked_m[g] rows of group g are computed and written (masked_m clamped to max_m,
so a bad count can never reach past the group's rows)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import INTERPRET, serialized
from ._launch import autotuned, launch, m_bucket, pick_config
from ._tile import gemm_tile, store_tile
from .grouped_contiguous import check_groups

OPS = {True: "m_grouped_fp8_gemm_nt_masked", False: "m_grouped_bf16_gemm_nt_masked"}


@triton.jit
def grouped_masked_kernel(a_ptr, b_ptr, d_ptr, masked_m_ptr, sa_ptr, sb_ptr, MAX_M, N, K, EXPECTED_M_BUCKET,
                          stride_ag, stride_am, stride_bg, stride_bn, stride_dg, stride_dm,
                          sa_stride_g, sa_stride_mn, sa_stride_k, sb_stride_g, sb_stride_mn, sb_stride_k,
                          SB_GRAN_N: tl.constexpr, IS_FP8: tl.constexpr, SA_PACKED: tl.constexpr,
                          SB_PACKED: tl.constexpr, SA_MN_UNIT: tl.constexpr, SB_MN_UNIT: tl.constexpr,
                          OUT_BF16: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # MN-major scales with a compile-time unit stride load as vectors (as in fp8_gemm)
    if SA_MN_UNIT:
        sa_stride_mn = 1
    if SB_MN_UNIT:
        sb_stride_mn = 1
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    group = tl.program_id(2)
    rows = tl.minimum(tl.maximum(tl.load(masked_m_ptr + group), 0), MAX_M)
    if pid_m * BLOCK_M < rows:
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_m = rm < rows
        mask_n = rn < N
        g64 = group.to(tl.int64)
        acc = gemm_tile(a_ptr + g64 * stride_ag, b_ptr + g64 * stride_bg, sa_ptr + g64 * sa_stride_g,
                        sb_ptr + g64 * sb_stride_g, rm, rn, mask_m, mask_n, K, stride_am, stride_bn, 1, 1,
                        sa_stride_mn, sa_stride_k, sb_stride_mn, sb_stride_k, 1, SB_GRAN_N, IS_FP8, SA_PACKED,
                        SB_PACKED, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET)
        store_tile(d_ptr + g64 * stride_dg, d_ptr, acc, rm, rn, mask_m[:, None] & mask_n[None, :], stride_dm, 0, 0,
                   False, OUT_BF16, INTERPRET)


CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 128}, num_warps=4, num_stages=5),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=4),
]
_tuned = autotuned(grouped_masked_kernel, CONFIGS, key=["EXPECTED_M_BUCKET", "MAX_M", "N", "K", "IS_FP8",
                                                        "SA_PACKED", "SB_PACKED", "SA_MN_UNIT", "SB_MN_UNIT",
                                                        "OUT_BF16"])


@serialized
def m_grouped_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                             expected_m: int, *, sfa: torch.Tensor | None = None, sfb: torch.Tensor | None = None,
                             gran_a: tuple[int, int] = (1, 128), gran_b: tuple[int, int] = (128, 128),
                             config: triton.Config | None = None) -> None:
    """Masked grouped GEMM written into d (rows < masked_m[g] only).

    fp8 (sfa, sfb given): a e4m3 [G, max_m, K] with per-row scales sfa ([G, max_m, kb] fp32 any
    strides, or sm100 words [G, max_m, w]); b e4m3 [G, N, K] with sfb. bf16: a bf16 [G, max_m, K],
    b bf16 [G, N, K]. d: bf16/fp32 [G, max_m, N] contiguous; masked_m: int32 [G]; expected_m: a
    host-side hint (rows per group) that picks the tuned config.
    """
    is_fp8 = sfa is not None or sfb is not None
    op = OPS[is_fp8]
    check_groups(op, a, b, torch.float8_e4m3fn if is_fp8 else torch.bfloat16, 3)
    (g, max_m, k), n = a.shape, b.shape[1]
    device = a.device
    if a.shape[0] != g or b.shape[0] != g:
        _checks.fail(op, "b", f"with {b.shape[0]} groups", f"G = {g} like a", "pass one weight per group")
    if is_fp8:
        if gran_a[0] != 1 or gran_a[1] != gran_b[1]:
            _checks.fail(op, "gran_a", gran_a, f"(1, {gran_b[1]})", "quantize activations per token with b's gran_k")
        _checks.block_k(op, "gran_a", gran_a[1])
        _checks.scale_storage(op, "sfa", sfa, max_m, k, gran_a, device, groups=g)
        _checks.scale_storage(op, "sfb", sfb, n, k, gran_b, device, groups=g)
    _checks.gemm_output(op, d, None, (g, max_m, n), device)
    _checks.tensor(op, "masked_m", masked_m, (torch.int32,), (g,), device)
    if max_m == 0 or n == 0:
        return
    sa = sfa if is_fp8 else a
    sb = sfb if is_fp8 else b
    sa_strides = tuple(sa.stride()) if is_fp8 else (0, 0, 0)
    sb_strides = tuple(sb.stride()) if is_fp8 else (0, 0, 0)
    args = (a, b, d, masked_m, sa, sb, max_m, n, k, m_bucket(int(expected_m)), a.stride(0), a.stride(1),
            b.stride(0), b.stride(1), d.stride(0), d.stride(1), *sa_strides, *sb_strides)
    constants = dict(SB_GRAN_N=gran_b[0] if is_fp8 else 1, IS_FP8=is_fp8,
                     SA_PACKED=is_fp8 and sa.dtype == torch.int32, SB_PACKED=is_fp8 and sb.dtype == torch.int32,
                     SA_MN_UNIT=is_fp8 and sa_strides[1] == 1, SB_MN_UNIT=is_fp8 and sb_strides[1] == 1,
                     OUT_BF16=d.dtype == torch.bfloat16, BLOCK_K=gran_a[1] if is_fp8 else 64, INTERPRET=INTERPRET)

    def grid(meta):
        return (triton.cdiv(max_m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]), g)

    launch(grouped_masked_kernel, _tuned, grid, args, constants, config, pick_config(CONFIGS, int(expected_m)))
