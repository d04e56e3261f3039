"""bf16_gemm_{nt,nn,tn,tt} in Triton: D = C + A·Bᵀ for bf16 A [M, K] and B [N, K], fp32 accumulation.

A and B are logical views with any strides: K-major (the nt GEMM's operands) or MN-major (the
nn/tn/tt GEMMs' stored transposes, seen through `.mT`). Whether each is K-major is a constexpr, so
the common case compiles with a unit K stride, and it is part of the autotuning key.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import INTERPRET, serialized
from ._launch import autotuned, launch, m_bucket, pick_config
from ._tile import gemm_tile, store_tile, tile_ids

OP = "bf16_gemm_nt"


@triton.jit
def bf16_gemm_nt_kernel(a_ptr, b_ptr, d_ptr, c_ptr, M, N, K, M_BUCKET, stride_am, stride_ak, stride_bn, stride_bk,
                        stride_dm, stride_cm, stride_cn, A_K_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr,
                        A_M_MAJOR: tl.constexpr, B_N_MAJOR: tl.constexpr, HAS_C: tl.constexpr, OUT_BF16: tl.constexpr,
                        INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # a compile-time unit stride: contiguous (vector, cp.async) loads along K or, for a stored
    # transpose, along M / N; a runtime unit stride leaves them scalar (840 B of spills on sm90 at
    # 128x256). Not for the 16-row mma.sync tile: its transposed operand layout spills kilobytes
    if A_K_MAJOR:
        stride_ak = 1
    elif A_M_MAJOR and BLOCK_M >= 64:
        stride_am = 1
    if B_K_MAJOR:
        stride_bk = 1
    elif B_N_MAJOR and BLOCK_M >= 64:
        stride_bn = 1
    pid_m, pid_n = tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rm < M
    mask_n = rn < N
    acc = gemm_tile(a_ptr, b_ptr, a_ptr, b_ptr, rm, rn, mask_m, mask_n, K, stride_am, stride_bn, stride_ak,
                    stride_bk, 0, 0, 0, 0, 1, 1, False, False, False, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET)
    store_tile(d_ptr, c_ptr, acc, rm, rn, mask_m[:, None] & mask_n[None, :], stride_dm, stride_cm, stride_cn,
               HAS_C, OUT_BF16, INTERPRET)


CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 1}, num_warps=4, num_stages=5),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
]
_tuned = autotuned(bf16_gemm_nt_kernel, CONFIGS, key=["M_BUCKET", "N", "K", "A_K_MAJOR", "B_K_MAJOR", "A_M_MAJOR",
                                                     "B_N_MAJOR", "HAS_C", "OUT_BF16"])


@serialized
def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None, *,
                 config: triton.Config | None = None) -> None:
    """D = C + A·Bᵀ written into d. a: bf16 [M, K], b: bf16 [N, K], any strides (K-major for the nt
    GEMM; the `.mT` views of stored [K, M] / [K, N] tensors for nn, tn, tt); d: bf16/fp32 [M, N]
    contiguous; c: None or fp32 (or d's dtype) [M, N]. `config` pins one triton.Config."""
    _checks.tensor(OP, "a", a, (torch.bfloat16,), (None, None))
    m, k = a.shape
    _checks.tensor(OP, "b", b, (torch.bfloat16,), (None, k), a.device)
    n = b.shape[0]
    if k < 1:
        _checks.fail(OP, "a", "empty along K", "K >= 1", "a GEMM over K = 0 is just C")
    _checks.gemm_output(OP, d, c, (m, n), a.device)
    if m == 0 or n == 0:
        return
    c_arg = c if c is not None else d
    args = (a, b, d, c_arg, m, n, k, m_bucket(m), a.stride(0), a.stride(1), b.stride(0), b.stride(1), d.stride(0),
            c_arg.stride(0), c_arg.stride(1))
    constants = dict(A_K_MAJOR=a.stride(1) == 1, B_K_MAJOR=b.stride(1) == 1, A_M_MAJOR=a.stride(0) == 1,
                     B_N_MAJOR=b.stride(0) == 1, HAS_C=c is not None,
                     OUT_BF16=d.dtype == torch.bfloat16, INTERPRET=INTERPRET)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    launch(bf16_gemm_nt_kernel, _tuned, grid, args, constants, config, pick_config(CONFIGS, m))
