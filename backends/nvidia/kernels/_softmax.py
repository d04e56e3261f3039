"""The online-softmax step the nvidia attention kernels share (MLA decode, sparse MLA prefill,
varlen attention): one key tile folded into the running max, sum and output accumulator, in base 2.

The one rule: a row that has seen no key yet keeps max -inf and sum 0 without producing a NaN
(exp2(-inf - -inf) is avoided by using 0 as that row's reference), so a kernel tells "no key" by
sum == 0 at the end. P.V runs on half operands: P rounded to the values' dtype (bf16 or fp16), and
with SPLIT_P its rounding error as a second half term (about 16 bits of P with bf16), one more MMA.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import dot, to_half


@triton.jit
def online_softmax_step(scores, m_i, l_i, acc):
    """Fold one tile of base-2 logits `scores` [M, N] (-inf where masked) into the running max
    `m_i` [M], sum `l_i` [M] and accumulator `acc` [M, D] (rescaled here).
    Returns (p fp32 [M, N], new max, new sum, rescaled acc)."""
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(scores - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    return p, m_new, l_i, acc


@triton.jit
def half_terms(p, SPLIT_P: tl.constexpr, FP16: tl.constexpr, INTERPRET: tl.constexpr):
    """(p_hi, p_lo): P rounded to the half dtype and, with SPLIT_P, its rounding error as a second
    half term (p_lo is p_hi, unused, without). Taken before the value tile is loaded: in that order
    the MLA decode kernel does not spill on sm_100a (docs/nvidia.md)."""
    p_hi = to_half(p, FP16, INTERPRET)
    p_lo = p_hi
    if SPLIT_P:
        p_lo = to_half(p - p_hi.to(tl.float32), FP16, INTERPRET)
    return p_hi, p_lo


@triton.jit
def accumulate_pv(p_hi, p_lo, values, acc, SPLIT_P: tl.constexpr, INTERPRET: tl.constexpr):
    """acc + (p_hi [+ p_lo with SPLIT_P]) @ values, fp32 accumulation."""
    acc = dot(p_hi, values, acc, INTERPRET)
    if SPLIT_P:
        acc = dot(p_lo, values, acc, INTERPRET)
    return acc
