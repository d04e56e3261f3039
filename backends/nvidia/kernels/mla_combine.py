"""The combine step of split-KV MLA decode: merge the partial (out, lse) of every batch the
schedule split over several parts into the final out (bf16 or fp16) and fp32 lse.

out = Σ_i exp(lse_i - lse) · out_i with lse = log Σ_i exp(lse_i); partials of empty ranges carry
lse -inf and weigh nothing; a row with no visible key anywhere gets out 0, lse +inf. Batches with
one split were written by the decode kernel itself and are skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, serialized, to_half

#: query rows (heads) per combine program
BLOCK_HC = 16


@triton.jit
def mla_combine_kernel(splits_ptr, oacc_ptr, lacc_ptr, out_ptr, lse_ptr, S_Q, H_Q,
                       stride_as, stride_aq, stride_ah, stride_las, stride_laq,
                       stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                       LATENT: tl.constexpr, BLOCK_HC: tl.constexpr, FP16: tl.constexpr, INTERPRET: tl.constexpr):
    b = tl.program_id(0)
    rest = tl.program_id(1)
    head_tiles = tl.cdiv(H_Q, BLOCK_HC)
    s = rest // head_tiles
    heads = (rest % head_tiles) * BLOCK_HC + tl.arange(0, BLOCK_HC)
    hmask = heads < H_Q
    first = tl.load(splits_ptr + b)
    count = tl.load(splits_ptr + b + 1) - first
    if count > 1:
        cols = tl.arange(0, LATENT)
        lse_max = tl.full((BLOCK_HC,), float("-inf"), tl.float32)
        for i in range(0, count):
            part = tl.load(lacc_ptr + (first + i).to(tl.int64) * stride_las + s * stride_laq + heads, mask=hmask,
                           other=float("-inf"))
            lse_max = tl.maximum(lse_max, part)
        any_keys = lse_max > float("-inf")
        shift = tl.where(any_keys, lse_max, 0.0)
        total = tl.zeros((BLOCK_HC,), tl.float32)
        acc = tl.zeros((BLOCK_HC, LATENT), tl.float32)
        for i in range(0, count):
            slot = (first + i).to(tl.int64)
            part = tl.load(lacc_ptr + slot * stride_las + s * stride_laq + heads, mask=hmask, other=float("-inf"))
            w = tl.exp(part - shift)
            o = tl.load(oacc_ptr + slot * stride_as + s * stride_aq + heads[:, None] * stride_ah + cols[None, :],
                        mask=hmask[:, None] & (w > 0.0)[:, None], other=0.0)
            total += w
            acc += w[:, None] * o
        o = acc / tl.where(any_keys, total, 1.0)[:, None]
        lse = tl.where(any_keys, shift + tl.log(tl.where(any_keys, total, 1.0)), float("inf"))
        o_ptrs = out_ptr + b * stride_ob + s * stride_os + heads[:, None] * stride_oh + cols[None, :]
        tl.store(o_ptrs, to_half(o, FP16, INTERPRET), mask=hmask[:, None])
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + s, lse, mask=hmask)


@serialized
def mla_combine(num_splits: torch.Tensor, oacc: torch.Tensor, lacc: torch.Tensor, out: torch.Tensor,
                lse: torch.Tensor) -> None:
    """Merge the partials of split batches (num_splits int32 [b + 1] prefix sums) into out and lse."""
    b, s_q, h_q, latent = out.shape
    grid = (b, s_q * triton.cdiv(h_q, BLOCK_HC))
    mla_combine_kernel[grid](num_splits, oacc, lacc, out, lse, s_q, h_q, oacc.stride(0), oacc.stride(1),
                             oacc.stride(2), lacc.stride(0), lacc.stride(1), out.stride(0), out.stride(1),
                             out.stride(2), lse.stride(0), lse.stride(1), LATENT=latent, BLOCK_HC=BLOCK_HC,
                             FP16=out.dtype == torch.float16,
                             INTERPRET=INTERPRET, num_warps=4)
