"""bf16_gemm_nt in Triton: D = C + A·Bᵀ for bf16 A [M, K] and B [N, K] (K-major), fp32 accumulation."""

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
def bf16_gemm_nt_kernel(a_ptr, b_ptr, d_ptr, c_ptr, M, N, K, M_BUCKET, stride_am, stride_bn, stride_dm,
                        stride_cm, stride_cn, HAS_C: tl.constexpr, OUT_BF16: tl.constexpr,
                        INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rm < M
    mask_n = rn < N
    acc = gemm_tile(a_ptr, b_ptr, a_ptr, b_ptr, rm, rn, mask_m, mask_n, K, stride_am, stride_bn, 0, 0, 0, 0, 1, 1,
                    False, False, False, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET)
    store_tile(d_ptr, c_ptr, acc, rm, rn, mask_m[:, None] & mask_n[None, :], stride_dm, stride_cm, stride_cn,
               HAS_C, OUT_BF16, INTERPRET)


CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 1}, num_warps=4, num_stages=5),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
]
_tuned = autotuned(bf16_gemm_nt_kernel, CONFIGS, key=["M_BUCKET", "N", "K", "HAS_C", "OUT_BF16"])


@serialized
def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None, *,
                 config: triton.Config | None = None) -> None:
    """D = C + A·Bᵀ written into d. a: bf16 [M, K], b: bf16 [N, K] (both K-major); d: bf16/fp32 [M, N]
    contiguous; c: None or fp32 (or d's dtype) [M, N]. `config` pins one triton.Config."""
    _checks.tensor(OP, "a", a, (torch.bfloat16,), (None, None))
    m, k = a.shape
    _checks.tensor(OP, "b", b, (torch.bfloat16,), (None, k), a.device)
    n = b.shape[0]
    _checks.inner_contiguous(OP, "a", a)
    _checks.inner_contiguous(OP, "b", b)
    if k < 1:
        _checks.fail(OP, "a", "empty along K", "K >= 1", "a GEMM over K = 0 is just C")
    _checks.gemm_output(OP, d, c, (m, n), a.device)
    if m == 0 or n == 0:
        return
    c_arg = c if c is not None else d
    args = (a, b, d, c_arg, m, n, k, m_bucket(m), a.stride(0), b.stride(0), d.stride(0), c_arg.stride(0),
            c_arg.stride(1))
    constants = dict(HAS_C=c is not None, OUT_BF16=d.dtype == torch.bfloat16, INTERPRET=INTERPRET)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    launch(bf16_gemm_nt_kernel, _tuned, grid, args, constants, config, pick_config(CONFIGS, m))
