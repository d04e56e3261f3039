"""flash_mla_sparse_fwd in Triton: sparse MLA prefill, each query token attending to the kv rows its
indices list, on the decode kernel's tiles (mla_decode.py) without its split-KV schedule (a
prefill has s_q x head tiles programs to fill the GPU with).

One program = one query token x one tile of BLOCK_H heads (the MMA's M: 128 heads on 8 warps, two
warp groups of 64 rows, or 64 heads on 4 warps when h_q <= 64; rows past h_q are masked) x one of
V_SPLITS = 4 blocks of 128 output channels (the fastest grid axis: the four programs of a tile are
adjacent and share each key tile in L2). Per key tile of BLOCK_N indices (64 with 128-row tiles,
32 with 64-row ones: HEAD_TILES) a program gathers the
rows' four 128-channel latent blocks and the 64 RoPE channels for Q.K (summed in one fixed order,
so the four splits of a head see bit-identical scores, max and lse), then its own block once more
for P.V; online softmax in base 2. P is carried as two half terms (hi + lo, about 16 bits with
bf16), one more MMA per key tile, as the decode kernel does by default. Masked keys: index -1,
index >= s_kv, and t >= topk_length[i]; key tiles past topk_length are not visited and masked
rows are never read. Results: out in q's dtype, max_logits (of the scaled logits) and lse (natural
log) fp32; attn_sink scales out by 1 / (1 + exp(sink - lse)) and leaves lse alone; a row without a
key gets out 0, max_logits -inf, lse +inf.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portable_kernels.layouts.constants import KV_LATENT_DIM, KV_ROPE_DIM

from . import _checks
from ._common import INTERPRET, dot, serialized, to_half
from ._softmax import accumulate_pv, half_terms, online_softmax_step

OP = "flash_mla_sparse_fwd"
#: dtypes of q, kv and out (one of them per call)
HALF_DTYPES = (torch.bfloat16, torch.float16)
LOG2E = 1.4426950408889634
#: programs per (token, head tile), each owning KV_LATENT_DIM / V_SPLITS output channels
V_SPLITS = 4
#: (largest h_q, BLOCK_H, BLOCK_N, warps): one warp group per 64 query rows; indices per key tile
#: as wide as the registers allow without a spill on sm_90a and sm_100a (docs/nvidia.md: 64-row
#: tiles spill with 64 indices, 128-row tiles do not)
HEAD_TILES = ((64, 64, 32, 4), (None, 128, 64, 8))
#: no software pipelining of the gathered key loads (as the decode kernel: a second stage spills)
NUM_STAGES = 1


def head_tile(h_q: int) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_N, num_warps) for h_q query heads."""
    for limit, block_h, block_n, warps in HEAD_TILES:
        if limit is None or h_q <= limit:
            return block_h, block_n, warps
    raise AssertionError("HEAD_TILES ends with an open row")


@triton.jit
def _load_rows(kv_ptr, base, ok, col0, WIDTH: tl.constexpr):
    """Channels [col0, col0 + WIDTH) of the gathered kv rows at element offsets `base` [BLOCK_N]."""
    return tl.load((kv_ptr + col0 + base)[:, None] + tl.arange(0, WIDTH)[None, :], mask=ok[:, None], other=0.0)


@triton.jit
def _load_q(q_row, col0, hmask, WIDTH: tl.constexpr):
    """Query channels [col0, col0 + WIDTH) of the tile's rows (pointers `q_row` [BLOCK_H, 1])."""
    return tl.load(q_row + col0 + tl.arange(0, WIDTH)[None, :], mask=hmask[:, None], other=0.0)


@triton.jit
def mla_sparse_prefill_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, max_ptr, lse_ptr,
                              H_Q, S_KV, TOPK, scale_log2, stride_qs, stride_kv, stride_is,
                              Q_HEAD_STRIDE: tl.constexpr, HAS_ROPE: tl.constexpr, HAS_LENGTH: tl.constexpr,
                              HAS_SINK: tl.constexpr, LATENT: tl.constexpr, ROPE: tl.constexpr,
                              SPLIT_P: tl.constexpr, FP16: tl.constexpr, BLOCK_H: tl.constexpr,
                              BLOCK_N: tl.constexpr, V_SPLITS: tl.constexpr, INTERPRET: tl.constexpr):
    tl.static_assert((V_SPLITS == 1) | (V_SPLITS == 2) | (V_SPLITS == 4))
    BLOCK_V: tl.constexpr = LATENT // V_SPLITS
    v = tl.program_id(0) % V_SPLITS
    rest = tl.program_id(0) // V_SPLITS
    head_tiles = tl.cdiv(H_Q, BLOCK_H)
    head0 = (rest % head_tiles) * BLOCK_H
    s = rest // head_tiles
    rows = tl.arange(0, BLOCK_H)
    heads = head0 + rows
    hmask = heads < H_Q
    own_cols = v * BLOCK_V + tl.arange(0, BLOCK_V)
    q_row = q_ptr + (s.to(tl.int64) * stride_qs + head0 * Q_HEAD_STRIDE) + rows[:, None] * Q_HEAD_STRIDE
    qs = _load_q(q_row, 0, hmask, BLOCK_V),
    for c in tl.static_range(1, V_SPLITS):
        qs = qs + (_load_q(q_row, c * BLOCK_V, hmask, BLOCK_V),)
    q_rope = qs[0]
    if HAS_ROPE:
        q_rope = _load_q(q_row, LATENT, hmask, ROPE)
    visible = TOPK
    if HAS_LENGTH:
        visible = tl.minimum(tl.load(len_ptr + s), TOPK)
    idx_row = idx_ptr + s.to(tl.int64) * stride_is
    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_V), tl.float32)
    for tile in range(0, tl.cdiv(visible, BLOCK_N)):
        t = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        slot = tl.load(idx_row + t, mask=t < visible, other=-1)
        ok = (slot >= 0) & (slot < S_KV)
        base = tl.where(ok, slot, 0).to(tl.int64) * stride_kv
        ks = _load_rows(kv_ptr, base, ok, 0, BLOCK_V),
        for c in tl.static_range(1, V_SPLITS):
            ks = ks + (_load_rows(kv_ptr, base, ok, c * BLOCK_V, BLOCK_V),)
        zero = tl.zeros((BLOCK_H, BLOCK_N), tl.float32)
        # Q.K over the channel blocks in one fixed order in every V split of a head: bit-identical
        # scores (one max, one lse) whichever block a program owns
        scores = dot(qs[0], tl.trans(ks[0]), zero, INTERPRET)
        for c in tl.static_range(1, V_SPLITS):
            scores = dot(qs[c], tl.trans(ks[c]), scores, INTERPRET)
        if HAS_ROPE:
            k_rope = _load_rows(kv_ptr, base, ok, LATENT, ROPE)
            scores = dot(q_rope, tl.trans(k_rope), scores, INTERPRET)
        scores = tl.where(ok[None, :], scores * scale_log2, float("-inf"))
        p, m_i, l_i, acc = online_softmax_step(scores, m_i, l_i, acc)
        p_hi, p_lo = half_terms(p, SPLIT_P, FP16, INTERPRET)  # split-P: ~16-bit P with bf16
        k_own = ks[0]
        if V_SPLITS > 1:
            k_own = _load_rows(kv_ptr, base, ok, v * BLOCK_V, BLOCK_V)
        acc = accumulate_pv(p_hi, p_lo, k_own, acc, SPLIT_P, INTERPRET)
    has_keys = l_i > 0.0
    lse2 = m_i + tl.log2(tl.where(has_keys, l_i, 1.0))  # base 2, of the scaled logits
    norm = tl.where(has_keys, l_i, 1.0)
    if HAS_SINK:  # out * exp(lse) / (exp(lse) + exp(sink)); sink +inf gives 0, -inf leaves out alone
        sink = tl.load(sink_ptr + heads, mask=hmask, other=float("-inf"))
        norm = norm * (1.0 + tl.exp2(sink * 1.4426950408889634 - tl.where(has_keys, lse2, 0.0)))
    o = acc / norm[:, None]
    o_rows = out_ptr + (s.to(tl.int64) * H_Q + head0) * LATENT + rows[:, None] * LATENT
    tl.store(o_rows + own_cols[None, :], to_half(o, FP16, INTERPRET), mask=hmask[:, None])
    first = hmask & (rows * 0 + v == 0)  # every V split has the same max and lse; the first one writes them
    row_stats = s.to(tl.int64) * H_Q + heads
    tl.store(max_ptr + row_stats, tl.where(has_keys, m_i / 1.4426950408889634, float("-inf")), mask=first)
    tl.store(lse_ptr + row_stats, tl.where(has_keys, lse2 / 1.4426950408889634, float("inf")), mask=first)


def inner_stride_reasons(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor) -> list[str]:
    """Why the kernel cannot read these operands in place (it loads channels and indices as vectors)."""
    out = []
    for name, t in (("q", q), ("kv", kv), ("indices", indices)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            out.append(f"{name}'s last dim is not contiguous (stride {t.stride(-1)}); pass {name}.contiguous()")
    return out


@serialized
def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                         attn_sink: torch.Tensor | None, topk_length: torch.Tensor | None, out: torch.Tensor,
                         max_logits: torch.Tensor, lse: torch.Tensor, *, split_p: bool = True) -> None:
    """Sparse prefill into out [s_q, h_q, 512] of q's dtype, max_logits and lse fp32 [s_q, h_q].

    q: bf16 or fp16 [s_q, h_q, d], d = 576 (512 latent + 64 RoPE) or 512; kv [s_kv, 1, d] of q's
    dtype; indices int32 [s_q, 1, topk]; attn_sink None or fp32 [h_q]; topk_length None or int32
    [s_q] (values in [0, topk]: larger ones are clamped to topk). V = kv's first 512 channels.
    """
    _checks.tensor(OP, "q", q, HALF_DTYPES, (None, None, None))
    s_q, h_q, d = q.shape
    device = q.device
    if d not in (KV_LATENT_DIM, KV_LATENT_DIM + KV_ROPE_DIM):
        _checks.fail(OP, "q", f"of head dim {d}", "576 or 512", "pass MLA queries")
    _checks.tensor(OP, "kv", kv, (q.dtype,), (None, 1, d), device)
    _checks.tensor(OP, "indices", indices, (torch.int32,), (s_q, 1, None), device)
    problems = inner_stride_reasons(q, kv, indices)
    if problems:
        _checks.fail(OP, "q, kv, indices", "with a strided last dim", "unit stride along the last dim", problems[0])
    if attn_sink is not None:
        _checks.tensor(OP, "attn_sink", attn_sink, (torch.float32,), (h_q,), device)
        _checks.contiguous(OP, "attn_sink", attn_sink)
    if topk_length is not None:
        _checks.tensor(OP, "topk_length", topk_length, (torch.int32,), (s_q,), device)
        _checks.contiguous(OP, "topk_length", topk_length)
    _checks.tensor(OP, "out", out, (q.dtype,), (s_q, h_q, KV_LATENT_DIM), device)
    _checks.tensor(OP, "max_logits", max_logits, (torch.float32,), (s_q, h_q), device)
    _checks.tensor(OP, "lse", lse, (torch.float32,), (s_q, h_q), device)
    for name, t in (("out", out), ("max_logits", max_logits), ("lse", lse)):
        _checks.contiguous(OP, name, t)
    if out.numel() == 0:
        return
    block_h, block_n, warps = head_tile(h_q)
    dummy = indices
    grid = (s_q * triton.cdiv(h_q, block_h) * V_SPLITS,)
    mla_sparse_prefill_kernel[grid](
        q, kv, indices, dummy if topk_length is None else topk_length, dummy if attn_sink is None else attn_sink,
        out, max_logits, lse, h_q, kv.shape[0], indices.shape[-1], float(sm_scale) * LOG2E,
        q.stride(0), kv.stride(0), indices.stride(0),
        q.stride(1),  # a constexpr: row offsets fold into the loads' immediates (as in the decode kernel)
        HAS_ROPE=d > KV_LATENT_DIM, HAS_LENGTH=topk_length is not None, HAS_SINK=attn_sink is not None,
        LATENT=KV_LATENT_DIM, ROPE=KV_ROPE_DIM, SPLIT_P=split_p, FP16=q.dtype == torch.float16,
        BLOCK_H=block_h, BLOCK_N=block_n, V_SPLITS=V_SPLITS, INTERPRET=INTERPRET,
        num_warps=warps, num_stages=NUM_STAGES)
