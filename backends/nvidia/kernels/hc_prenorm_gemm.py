"""tf32_hc_prenorm_gemm in Triton: d = a · bᵀ (TF32 MMA) and sqr_sum = Σ a² in one pass over a.

One program = one tile of BLOCK_M rows x one K split. It walks its split's K range in BLOCK_K
steps: the bf16 a tile is widened to fp32 once and feeds both the TF32 dot against the whole fp32 b
tile (N is small, 24 in DeepGEMM's use: one BLOCK_N tile covers it) and the fp32 sum of squares.
The split's partial sums go to d[s] and sqr_sum[s] (the op's contract: S consecutive ranges of
ceil(K / S) columns). In the interpreter the dot runs in fp32 ("ieee"), so emulation is closer to
the exact sums than a GPU's TF32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import INTERPRET, serialized

OP = "tf32_hc_prenorm_gemm"
BLOCK_M = 64    # rows per program: wgmma's M on sm90
BLOCK_K = 64
#: the widest N one program covers (the b tile is loaded whole per K step)
MAX_N = 256


@triton.jit
def hc_prenorm_gemm_kernel(a_ptr, b_ptr, d_ptr, s_ptr, M, N, K, CHUNK, stride_am, stride_bn, stride_ds, stride_dm,
                           stride_ss, INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    mask_m = rm < M
    mask_n = rn < N
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    sq = tl.zeros((BLOCK_M,), tl.float32)
    for k0 in range(lo, hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        mask_k = rk < hi
        a = tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0).to(tl.float32)
        b = tl.load(b_ptr + rn[:, None] * stride_bn + rk[None, :], mask=mask_n[:, None] & mask_k[None, :],
                    other=0.0)
        if INTERPRET:
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc, input_precision="tf32")
        sq += tl.sum(a * a, axis=1)
    tl.store(d_ptr + split * stride_ds + rm[:, None] * stride_dm + rn[None, :], acc,
             mask=mask_m[:, None] & mask_n[None, :])
    tl.store(s_ptr + split * stride_ss + rm, sq, mask=mask_m)


@serialized
def tf32_hc_prenorm_gemm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, sqr_sum: torch.Tensor,
                         num_splits: int | None) -> None:
    """a bf16 [M, K] (stride(1) 1), b fp32 [N <= 256, K] (stride(1) 1), d fp32 [(S,) M, N] and
    sqr_sum fp32 [(S,) M] contiguous: the op's contract (portable_kernels.ops.gemm.hc_prenorm)."""
    _checks.tensor(OP, "a", a, (torch.bfloat16,), (None, None))
    m, k = a.shape
    device = a.device
    _checks.tensor(OP, "b", b, (torch.float32,), (None, k), device)
    n = b.shape[0]
    if n < 1 or n > MAX_N or k < 1:
        _checks.fail(OP, "b", f"of shape {tuple(b.shape)}", f"1 <= N <= {MAX_N} and K >= 1",
                     "the Triton kernel covers N in one tile; larger N runs elsewhere")
    splits = 1 if num_splits is None else int(num_splits)
    lead = () if num_splits is None else (splits,)
    _checks.tensor(OP, "d", d, (torch.float32,), (*lead, m, n), device)
    _checks.tensor(OP, "sqr_sum", sqr_sum, (torch.float32,), (*lead, m), device)
    _checks.contiguous(OP, "d", d)
    _checks.contiguous(OP, "sqr_sum", sqr_sum)
    for arg, t in (("a", a), ("b", b)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            _checks.fail(OP, arg, f"strides {t.stride()}", "K-major (stride(1) == 1)", f"pass {arg}.contiguous()")
    if m == 0:
        return
    chunk = -(-k // splits)
    block_n = max(16, triton.next_power_of_2(n))
    grid = (triton.cdiv(m, BLOCK_M), splits)
    hc_prenorm_gemm_kernel[grid](a, b, d, sqr_sum, m, n, k, chunk, a.stride(0), b.stride(0), m * n, n, m,
                                 INTERPRET=INTERPRET, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=BLOCK_K, num_warps=4)
