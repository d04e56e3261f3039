"""fp8_gemm_nt in Triton: D = C + A·Bᵀ with block-scaled e4m3 operands, read in the nvidia formats.

Scales are read where they lie, never decoded first: fp32 storage of any strides (sm90: per-row
SFA MN-major and TMA-aligned, 128x128 SFB as is; also the plain row-major form) or sm100 UE8M0
exponents packed four K-blocks per int32 (per-row). The K loop steps one scale block at a time:
each block's fp32 partial product is scaled by sa[m]·sb[n] and added to the accumulator (the
"promotion" DeepGEMM does on Hopper). K, M and N need no alignment (edges are masked).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import INTERPRET, serialized
from ._launch import autotuned, launch, m_bucket, pick_config
from ._tile import gemm_tile, store_tile, tile_ids

OP = "fp8_gemm_nt"


@triton.jit
def fp8_gemm_nt_kernel(a_ptr, b_ptr, d_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, M_BUCKET,
                       stride_am, stride_bn, stride_dm, stride_cm, stride_cn,
                       sa_stride_mn, sa_stride_k, sb_stride_mn, sb_stride_k,
                       SA_GRAN_M: tl.constexpr, SB_GRAN_N: tl.constexpr, SA_PACKED: tl.constexpr,
                       SB_PACKED: tl.constexpr, SA_MN_UNIT: tl.constexpr, SB_MN_UNIT: tl.constexpr,
                       BLOCK_K: tl.constexpr, HAS_C: tl.constexpr, OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # MN-major scales (sm90 SFA, sm100 words) with a compile-time unit stride load as vectors; a
    # runtime 1 leaves one scalar load and one 64-bit address per row (432 B of spills on sm100)
    if SA_MN_UNIT:
        sa_stride_mn = 1
    if SB_MN_UNIT:
        sb_stride_mn = 1
    pid_m, pid_n = tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rm < M
    mask_n = rn < N
    acc = gemm_tile(a_ptr, b_ptr, sa_ptr, sb_ptr, rm, rn, mask_m, mask_n, K, stride_am, stride_bn, 1, 1,
                    sa_stride_mn, sa_stride_k, sb_stride_mn, sb_stride_k, SA_GRAN_M, SB_GRAN_N, True, SA_PACKED,
                    SB_PACKED, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET)
    store_tile(d_ptr, c_ptr, acc, rm, rn, mask_m[:, None] & mask_n[None, :], stride_dm, stride_cm, stride_cn,
               HAS_C, OUT_BF16, INTERPRET)


CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "GROUP_M": 8}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 128, "GROUP_M": 1}, num_warps=4, num_stages=5),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
]
_tuned = autotuned(fp8_gemm_nt_kernel, CONFIGS, key=["M_BUCKET", "N", "K", "SA_PACKED", "SB_PACKED", "SB_GRAN_N",
                                                     "SA_MN_UNIT", "SB_MN_UNIT", "HAS_C", "OUT_BF16"])


@serialized
def fp8_gemm_nt(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
                c: torch.Tensor | None = None, *, gran_a: tuple[int, int] = (1, 128),
                gran_b: tuple[int, int] = (128, 128), config: triton.Config | None = None) -> None:
    """D = C + A·Bᵀ written into d.

    a: e4m3 [M, K] K-major; sfa: its scale storage with granularity `gran_a` (fp32 any strides, or
    int32 sm100 words for per-row scales); b: e4m3 [N, K] K-major; sfb: idem with `gran_b`;
    d: bf16/fp32 [M, N] contiguous; c: None or fp32 (or d's dtype) [M, N].
    gran_a[1] == gran_b[1] must be a power of two in 16..256. `config` pins one triton.Config.
    """
    _checks.tensor(OP, "a", a, (torch.float8_e4m3fn,), (None, None))
    m, k = a.shape
    device = a.device
    _checks.tensor(OP, "b", b, (torch.float8_e4m3fn,), (None, k), device)
    n = b.shape[0]
    _checks.inner_contiguous(OP, "a", a)
    _checks.inner_contiguous(OP, "b", b)
    if gran_a[1] != gran_b[1]:
        _checks.fail(OP, "gran_b", gran_b, f"the K granularity of a ({gran_a[1]})", "quantize both with one gran_k")
    _checks.block_k(OP, "gran_a", gran_a[1])
    if k < 1:
        _checks.fail(OP, "a", "empty along K", "K >= 1", "a GEMM over K = 0 is just C")
    _checks.scale_storage(OP, "sfa", sfa, m, k, gran_a, device)
    _checks.scale_storage(OP, "sfb", sfb, n, k, gran_b, device)
    _checks.gemm_output(OP, d, c, (m, n), device)
    if m == 0 or n == 0:
        return
    sa_packed, sb_packed = sfa.dtype == torch.int32, sfb.dtype == torch.int32
    c_arg = c if c is not None else d
    args = (a, b, d, c_arg, sfa, sfb, m, n, k, m_bucket(m), a.stride(0), b.stride(0), d.stride(0),
            c_arg.stride(0), c_arg.stride(1), sfa.stride(0), sfa.stride(1), sfb.stride(0), sfb.stride(1))
    constants = dict(SA_GRAN_M=gran_a[0], SB_GRAN_N=gran_b[0], SA_PACKED=sa_packed, SB_PACKED=sb_packed,
                     SA_MN_UNIT=sfa.stride(0) == 1, SB_MN_UNIT=sfb.stride(0) == 1,
                     BLOCK_K=gran_a[1], HAS_C=c is not None, OUT_BF16=d.dtype == torch.bfloat16,
                     INTERPRET=INTERPRET)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    launch(fp8_gemm_nt_kernel, _tuned, grid, args, constants, config, pick_config(CONFIGS, m))
