"""flash_attn_varlen_func in Triton: dense attention over packed variable-length sequences
(FlashMLA's dense prefill), forward only, flash-attention-2 style.

One program = one block of BLOCK_M query rows x one query head x one sequence (cu_seqlens_qo /
cu_seqlens_kv give its rows; programs past a short sequence's last block return at once). Grouped
query heads: head h reads KV head h // (h_q / h_kv). The program walks its sequence's keys in tiles
of BLOCK_N rows: Q.K on the tensor cores with fp32 accumulation, online softmax in base 2 (the
shared step of _softmax.py), P.V on half operands with P carried as two half terms (hi + lo, about
16 bits with bf16; SPLIT_P, on by default): flash-attention's single bf16 P leaves elements of
short sequences outside the contract's elementwise bounds (seen in the quick conformance cases),
at the price of one more MMA per key tile. The head dim d is split into a
power-of-two main part and a tail (192 = 128 + 64 with no padding; other sizes pad the tail with
masked zero channels); d_v pads to a power of two. Causal masks are bottom-right aligned: query i
of a sequence sees keys j <= s_k - s_q + i, so a block stops at its last visible key and rows
with no visible key (s_q > s_k) get out 0 and lse +inf, as do rows of an empty key sequence.
The key tiles every row of the block sees whole run in a first loop without masks (loads nor
scores); the diagonal and the last partial tile in a second, masked one.
Results: out in q's dtype, lse fp32 (natural log of the scaled logits' sum of exponentials).
Rows of out / lse past cu_seqlens_qo[-1] are not written (the public op fills them: 0 and +inf).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import INTERPRET, dot, serialized, to_half
from ._softmax import accumulate_pv, half_terms, online_softmax_step
from ._varlen_limits import head_dim_split, padded_dv, tile, unsupported_reasons

OP = "flash_attn_varlen_func"
#: dtypes of q, k, v and out (one of them per call)
HALF_DTYPES = (torch.bfloat16, torch.float16)
LOG2E = 1.4426950408889634


@triton.jit
def _load_tile(ptrs, rows_ok, COL0: tl.constexpr, D: tl.constexpr, WIDTH: tl.constexpr, MASK_ROWS: tl.constexpr):
    """Channels [COL0, COL0 + WIDTH) of the rows at pointers `ptrs` [R, 1]; channels >= D read as 0,
    and with MASK_ROWS rows not `rows_ok` too (each mask only where it can be false)."""
    cols = COL0 + tl.arange(0, WIDTH)
    if COL0 + WIDTH > D:
        if MASK_ROWS:
            return tl.load(ptrs + cols[None, :], mask=rows_ok[:, None] & (cols[None, :] < D), other=0.0)
        else:
            return tl.load(ptrs + cols[None, :], mask=cols[None, :] < D, other=0.0)
    else:
        if MASK_ROWS:
            return tl.load(ptrs + cols[None, :], mask=rows_ok[:, None], other=0.0)
        else:
            return tl.load(ptrs + cols[None, :])


@triton.jit
def _key_tile(n0, q_main, q_tail, rows, m_i, l_i, acc, k_base, v_base, stride_kt, stride_vt, s_k, diagonal,
              scale_log2, D: tl.constexpr, DV: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
              BLOCK_DV: tl.constexpr, MASKED: tl.constexpr, SPLIT_P: tl.constexpr, FP16: tl.constexpr,
              BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    """Keys [n0, n0 + BLOCK_N) folded into (m_i, l_i, acc). MASKED: the tile may hold keys past s_k
    or (diagonal = s_k - s_q, or None without causal) keys j > i + diagonal for some row i; without,
    every key is visible to every row and nothing is masked."""
    keys = n0 + tl.arange(0, BLOCK_N)
    keys_ok = keys < s_k
    k_rows = k_base + keys.to(tl.int64)[:, None] * stride_kt
    scores = dot(q_main, tl.trans(_load_tile(k_rows, keys_ok, 0, D, D_MAIN, MASKED)),
                 tl.zeros((q_main.shape[0], BLOCK_N), tl.float32), INTERPRET)
    if D_TAIL > 0:
        scores = dot(q_tail, tl.trans(_load_tile(k_rows, keys_ok, D_MAIN, D, D_TAIL, MASKED)), scores, INTERPRET)
    scores = scores * scale_log2
    if MASKED:
        visible = keys_ok[None, :]
        if diagonal is not None:
            visible = visible & (keys[None, :] <= rows[:, None] + diagonal)
        scores = tl.where(visible, scores, float("-inf"))
    p, m_i, l_i, acc = online_softmax_step(scores, m_i, l_i, acc)
    p_hi, p_lo = half_terms(p, SPLIT_P, FP16, INTERPRET)
    values = _load_tile(v_base + keys.to(tl.int64)[:, None] * stride_vt, keys_ok, 0, DV, BLOCK_DV, MASKED)
    acc = accumulate_pv(p_hi, p_lo, values, acc, SPLIT_P, INTERPRET)
    return m_i, l_i, acc


@triton.jit
def varlen_attention_kernel(q_ptr, k_ptr, v_ptr, cu_q_ptr, cu_k_ptr, out_ptr, lse_ptr,
                            H_Q, GROUP, M_BLOCKS, scale_log2,
                            stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                            D: tl.constexpr, DV: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
                            BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr, SPLIT_P: tl.constexpr,
                            FP16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            INTERPRET: tl.constexpr):
    # program order: the q blocks of one (sequence, head) adjacent, then the heads of one KV head,
    # so programs running together share K and V tiles in L2
    pid = tl.program_id(0)
    mb = pid % M_BLOCKS
    head = (pid // M_BLOCKS) % H_Q
    seq = pid // (M_BLOCKS * H_Q)
    q0 = tl.load(cu_q_ptr + seq)
    s_q = tl.load(cu_q_ptr + seq + 1) - q0
    m0 = mb * BLOCK_M
    if m0 >= s_q:
        return
    k0 = tl.load(cu_k_ptr + seq)
    s_k = tl.load(cu_k_ptr + seq + 1) - k0
    kvh = head // GROUP
    rows = m0 + tl.arange(0, BLOCK_M)
    rows_ok = rows < s_q
    q_rows = q_ptr + (q0 + rows).to(tl.int64)[:, None] * stride_qt + head * stride_qh
    q_main = _load_tile(q_rows, rows_ok, 0, D, D_MAIN, True)
    q_tail = q_main
    if D_TAIL > 0:
        q_tail = _load_tile(q_rows, rows_ok, D_MAIN, D, D_TAIL, True)
    # the keys this block can see: all of them, or (causal) up to its last row's bottom-right limit;
    # the first `full` of them (whole tiles) every row sees, so their tiles run without masks
    end = s_k
    full = s_k
    diagonal = None
    if CAUSAL:
        diagonal = s_k - s_q
        end = tl.minimum(s_k, tl.maximum(diagonal + m0 + BLOCK_M, 0))
        full = tl.minimum(s_k, tl.maximum(diagonal + m0 + 1, 0))
    full = (full // BLOCK_N) * BLOCK_N
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    k_base = k_ptr + k0.to(tl.int64) * stride_kt + kvh * stride_kh
    v_base = v_ptr + k0.to(tl.int64) * stride_vt + kvh * stride_vh
    for n0 in range(0, full, BLOCK_N):
        m_i, l_i, acc = _key_tile(n0, q_main, q_tail, rows, m_i, l_i, acc, k_base, v_base, stride_kt, stride_vt,
                                  s_k, diagonal, scale_log2, D, DV, D_MAIN, D_TAIL, BLOCK_DV, False, SPLIT_P, FP16,
                                  BLOCK_N, INTERPRET)
    for n0 in range(full, end, BLOCK_N):
        m_i, l_i, acc = _key_tile(n0, q_main, q_tail, rows, m_i, l_i, acc, k_base, v_base, stride_kt, stride_vt,
                                  s_k, diagonal, scale_log2, D, DV, D_MAIN, D_TAIL, BLOCK_DV, True, SPLIT_P, FP16,
                                  BLOCK_N, INTERPRET)
    has_keys = l_i > 0.0
    norm = tl.where(has_keys, l_i, 1.0)
    o = acc / norm[:, None]
    lse = tl.where(has_keys, (m_i + tl.log2(norm)) / 1.4426950408889634, float("inf"))
    out_rows = (q0 + rows).to(tl.int64) * H_Q + head
    dv_cols = tl.arange(0, BLOCK_DV)
    tl.store(out_ptr + out_rows[:, None] * DV + dv_cols[None, :], to_half(o, FP16, INTERPRET),
             mask=rows_ok[:, None] & (dv_cols[None, :] < DV))
    tl.store(lse_ptr + out_rows, lse, mask=rows_ok)


@serialized
def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_qo: torch.Tensor,
                           cu_seqlens_kv: torch.Tensor, max_seqlen_qo: int, softmax_scale: float, causal: bool,
                           out: torch.Tensor, lse: torch.Tensor, *, split_p: bool = True) -> None:
    """Varlen attention into out [total_q, h_q, d_v] of q's dtype and lse fp32 [total_q, h_q].

    q: bf16 or fp16 [total_q, h_q, d]; k [total_kv, h_kv, d] and v [total_kv, h_kv, d_v] of q's
    dtype, h_q a multiple of h_kv, unit stride along the last dim (other strides free); cu_seqlens_*
    int32 [b + 1] (validated by the contract: non-decreasing from 0, ending within the totals);
    max_seqlen_qo >= every query sequence's length (it sizes the grid). d padded <= 256, d_v <= 256.
    """
    _checks.tensor(OP, "q", q, HALF_DTYPES, (None, None, None))
    total_q, h_q, d = q.shape
    device = q.device
    _checks.tensor(OP, "k", k, (q.dtype,), (None, None, d), device)
    total_kv, h_kv = k.shape[:2]
    _checks.tensor(OP, "v", v, (q.dtype,), (total_kv, h_kv, None), device)
    d_v = v.shape[-1]
    if h_kv < 1 or h_q % h_kv:
        _checks.fail(OP, "k", f"with {h_kv} heads", f"a divisor of h_q = {h_q}", "pass grouped-query heads")
    if d < 1 or d_v < 1:
        _checks.fail(OP, "q, v", f"with head dims {d} / {d_v}", "head dims >= 1", "pass non-empty heads")
    problems = unsupported_reasons(q, k, v)
    if problems:
        _checks.fail(OP, "q, k, v", f"with d = {d}, d_v = {d_v}, strides {q.stride()} / {k.stride()} / "
                     f"{v.stride()}", "what the kernel tiles hold", problems[0])
    _checks.tensor(OP, "cu_seqlens_qo", cu_seqlens_qo, (torch.int32,), (None,), device)
    b = cu_seqlens_qo.shape[0] - 1
    if b < 0:
        _checks.fail(OP, "cu_seqlens_qo", "empty", "[b + 1] entries", "start the cumulative sums with 0")
    _checks.tensor(OP, "cu_seqlens_kv", cu_seqlens_kv, (torch.int32,), (b + 1,), device)
    _checks.contiguous(OP, "cu_seqlens_qo", cu_seqlens_qo)
    _checks.contiguous(OP, "cu_seqlens_kv", cu_seqlens_kv)
    if isinstance(max_seqlen_qo, bool) or not isinstance(max_seqlen_qo, int) or max_seqlen_qo < 0:
        _checks.fail(OP, "max_seqlen_qo", repr(max_seqlen_qo), "an int >= 0", "pass the longest query sequence")
    _checks.tensor(OP, "out", out, (q.dtype,), (total_q, h_q, d_v), device)
    _checks.tensor(OP, "lse", lse, (torch.float32,), (total_q, h_q), device)
    _checks.contiguous(OP, "out", out)
    _checks.contiguous(OP, "lse", lse)
    if b == 0 or max_seqlen_qo == 0 or out.numel() == 0:
        return
    d_main, d_tail = head_dim_split(d)
    block_m, block_n, warps, stages = tile(d_v)
    m_blocks = triton.cdiv(max_seqlen_qo, block_m)
    grid = (b * h_q * m_blocks,)
    varlen_attention_kernel[grid](
        q, k, v, cu_seqlens_qo, cu_seqlens_kv, out, lse, h_q, h_q // h_kv, m_blocks, float(softmax_scale) * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        D=d, DV=d_v, D_MAIN=d_main, D_TAIL=d_tail, BLOCK_DV=padded_dv(d_v),
        CAUSAL=bool(causal), SPLIT_P=split_p, FP16=q.dtype == torch.float16, BLOCK_M=block_m, BLOCK_N=block_n,
        INTERPRET=INTERPRET, num_warps=warps, num_stages=stages)
