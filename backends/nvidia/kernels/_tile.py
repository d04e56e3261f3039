"""The GEMM tile shared by the dense and grouped kernels: the K loop of one BLOCK_M x BLOCK_N tile
(block-scaled fp8, or bf16), and its epilogue (optional C, rounding cast, masked store)."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import dot, load_scales, to_out


@triton.jit
def tile_ids(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row tiles share their B columns in L2."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    return pid_m, pid_n


@triton.jit
def gemm_tile(a_ptr, b_ptr, sa_ptr, sb_ptr, rm, rn, mask_m, mask_n, K, stride_am, stride_bn, stride_ak, stride_bk,
              sa_stride_mn, sa_stride_k, sb_stride_mn, sb_stride_k,
              SA_GRAN_M: tl.constexpr, SB_GRAN_N: tl.constexpr, IS_FP8: tl.constexpr, SA_PACKED: tl.constexpr,
              SB_PACKED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              INTERPRET: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N] = Σ_k A[rm, k]·B[rn, k] (fp8: each K block scaled by sa[m]·sb[n]).

    With IS_FP8 the K loop steps one scale block (BLOCK_K = gran_k); scales are read as stored.
    A and B may have any strides (stride_ak = 1: K-major; stride_am = 1: M-major, a stored transpose).
    """
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :].to(tl.int64) * stride_ak
    b_ptrs = b_ptr + rn[:, None].to(tl.int64) * stride_bn + rk[None, :].to(tl.int64) * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = rk < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_n[:, None] & k_mask[None, :], other=0.0)
        if IS_FP8:
            partial = dot(a, tl.trans(b), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), INTERPRET)
            sa = load_scales(sa_ptr, rm // SA_GRAN_M, kb, sa_stride_mn, sa_stride_k, mask_m, SA_PACKED)
            sb = load_scales(sb_ptr, rn // SB_GRAN_N, kb, sb_stride_mn, sb_stride_k, mask_n, SB_PACKED)
            acc += partial * sa[:, None] * sb[None, :]
        else:
            acc = dot(a, tl.trans(b), acc, INTERPRET)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def store_tile(d_ptr, c_ptr, acc, rm, rn, mask, stride_dm, stride_cm, stride_cn, HAS_C: tl.constexpr,
               OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr):
    """d[rm, rn] = acc (+ c[rm, rn]), rounded to d's dtype, only where `mask`."""
    if HAS_C:
        acc += tl.load(c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn, mask=mask,
                       other=0.0).to(tl.float32)
    tl.store(d_ptr + rm[:, None].to(tl.int64) * stride_dm + rn[None, :], to_out(acc, OUT_BF16, INTERPRET), mask=mask)
