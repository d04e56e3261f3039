"""flash_mla_with_kvcache in Triton: split-KV MLA decode over the paged cache, following the
schedule of mla_metadata.py, plus the combine kernel (mla_combine.py) for split batches.

One program = one part of the schedule x one V split x one (KV head, query token, tile of
BLOCK_H = 128 heads, the MMA's M: 64 per warp group, so Hopper runs wgmma and Blackwell tcgen05;
rows past the head group are masked). The 512 latent output channels are split V_SPLITS = 4 ways
across programs (adjacent program ids, so the four share each key tile in L2): a program keeps a
[128, 128] fp32 accumulator and recomputes the full 576-wide Q.K of its tile. Q.K is summed over
the four 128-channel blocks in one fixed order in every split, so the splits of a head see
bit-identical scores, softmax and lse. Per key tile (BLOCK_N tokens, gathered per token through
block_table, or through `indices` for sparse decode) a program loads the four latent blocks and
the RoPE part for Q.K, then its own block once more (from L2) for P.V; online softmax in base 2;
it writes either the final (out, lse) of a batch it covers alone or a partial (normalized out,
lse) into the batch's slot. q, a dense cache and out share one dtype, bf16 or fp16 ("half").
Caches: dense [blocks, page, h_kv, d] with d = 576 (512 latent + 64 RoPE) or 512; or (bf16 q only)
the 656-byte FP8 cache (512 e4m3 latent, 4 fp32 scales, 64 bf16 RoPE), dequantized on the load
path per 128-channel block: e4m3 -> bf16 times the block's power-of-two scale in bf16 (exact, no
fp32 tile). V = the 512 latent channels. P.V runs on half operands: FlashMLA rounds P to the half
dtype (`split_p=False`), which with bf16 on short sequences leaves errors above the contract's
bounds; by default P is carried as two half terms (hi + lo, about 16 bits with bf16), one more
MMA per key tile. Masked keys: t >= s_k, the causal limit t > s_k - s_q + i, and sparse -1 (or
out-of-range) indices; block_table entries are only read for visible tokens and are clamped to the
cache, so no access leaves it. No visible key: out 0, lse +inf.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portable_kernels.layouts.constants import KV_LATENT_DIM, KV_ROPE_DIM, KV_ROPE_OFFSET, KV_SCALE_TILE

from . import _checks
from ._common import INTERPRET, dot, serialized, to_half
from ._softmax import accumulate_pv, half_terms, online_softmax_step
from .mla_combine import mla_combine
from .mla_metadata import BLOCK_H, BLOCK_N, META_FIELDS, V_SPLITS

OP = "flash_mla_with_kvcache"
#: dtypes of q, a dense cache and out (one of them per call)
HALF_DTYPES = (torch.bfloat16, torch.float16)
LOG2E = 1.4426950408889634
#: two warp groups, one per 64 of the BLOCK_H = 128 query rows (Triton gives each its own wgmma rows)
NUM_WARPS = 8
#: no software pipelining of the key loads: a second stage of buffers and addresses spills (docs/nvidia.md)
NUM_STAGES = 1


@triton.jit
def _load_latent(kv_ptr, base, ok, col0, WIDTH: tl.constexpr, FP8: tl.constexpr, LATENT: tl.constexpr,
                 SCALE_TILE: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    """Latent channels [col0, col0 + WIDTH) of the tokens at element offsets `base`, [BLOCK_N, WIDTH]:
    the cache's own dtype from a dense cache; bf16 from the FP8 one, dequantized on the load path as
    e4m3 -> bf16 times the bf16 power-of-two scale of each 128-channel tile (exact, no fp32 tile)."""
    if FP8:
        TILES: tl.constexpr = WIDTH // SCALE_TILE
        tile = tl.arange(0, TILES)
        within = tl.arange(0, SCALE_TILE)
        rows = kv_ptr + base
        raw = tl.load(rows[:, None, None] + col0 + (tile[None, :, None] * SCALE_TILE + within[None, None, :]),
                      mask=ok[:, None, None], other=0)
        scale_ptr = (rows[:, None] + (LATENT + 4 * (col0 // SCALE_TILE)) + 4 * tile[None, :]).to(
            tl.pointer_type(tl.float32))
        scale = tl.load(scale_ptr, mask=ok[:, None], other=0.0)
        e4m3 = raw.to(tl.float8e4nv, bitcast=True)
        if INTERPRET:  # no direct e4m3 -> bf16 cast there; the fp32 product is the same (bf16-exact) value,
            latent = e4m3.to(tl.float32) * scale[:, :, None]  # and interpreted dots take fp32 anyway
        else:
            latent = e4m3.to(tl.bfloat16) * scale.to(tl.bfloat16)[:, :, None]
        return tl.reshape(latent, (BLOCK_N, WIDTH))
    else:
        rows = kv_ptr + col0 + base
        return tl.load(rows[:, None] + tl.arange(0, WIDTH)[None, :], mask=ok[:, None], other=0.0)


@triton.jit
def _load_q(q_row, col0, hmask, WIDTH: tl.constexpr):
    """Query channels [col0, col0 + WIDTH) of the tile's rows (pointers `q_row` [BLOCK_H, 1])."""
    return tl.load(q_row + col0 + tl.arange(0, WIDTH)[None, :], mask=hmask[:, None], other=0.0)


@triton.jit
def _load_rope(kv_ptr, base, ok, FP8: tl.constexpr, LATENT: tl.constexpr, ROPE: tl.constexpr,
               ROPE_OFFSET: tl.constexpr):
    """The RoPE channels [BLOCK_N, 64]: bf16 from the FP8 cache, the cache's dtype from a dense one."""
    rope_cols = tl.arange(0, ROPE)
    if FP8:
        ptrs = (kv_ptr + base[:, None] + ROPE_OFFSET + 2 * rope_cols[None, :]).to(tl.pointer_type(tl.bfloat16))
    else:
        ptrs = kv_ptr + base[:, None] + LATENT + rope_cols[None, :]
    return tl.load(ptrs, mask=ok[:, None], other=0.0)


@triton.jit
def mla_decode_kernel(q_ptr, kv_ptr, table_ptr, seqlens_ptr, idx_ptr, meta_ptr, splits_ptr, out_ptr, lse_ptr,
                      oacc_ptr, lacc_ptr, S_Q, G, TOPK, NUM_PAGES, PAGE, scale_log2,
                      stride_qb, stride_qs, stride_kp, stride_kt, stride_kh, stride_tb, stride_ib,
                      stride_is, stride_ob, stride_os, stride_lb, stride_lh, stride_as, stride_aq,
                      stride_las, stride_laq, Q_HEAD_STRIDE: tl.constexpr,
                      FP8: tl.constexpr, HAS_ROPE: tl.constexpr, SPARSE: tl.constexpr, CAUSAL: tl.constexpr,
                      LATENT: tl.constexpr, ROPE: tl.constexpr, ROPE_OFFSET: tl.constexpr,
                      SCALE_TILE: tl.constexpr, META_FIELDS: tl.constexpr, SPLIT_P: tl.constexpr,
                      FP16: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, V_SPLITS: tl.constexpr,
                      INTERPRET: tl.constexpr):
    tl.static_assert((V_SPLITS == 1) | (V_SPLITS == 2) | (V_SPLITS == 4))
    BLOCK_V: tl.constexpr = LATENT // V_SPLITS
    part = tl.program_id(0) // V_SPLITS
    v = tl.program_id(0) % V_SPLITS
    rest = tl.program_id(1)
    head_tiles = tl.cdiv(G, BLOCK_H)
    ht = rest % head_tiles
    s = (rest // head_tiles) % S_Q
    kvh = rest // (head_tiles * S_Q)
    rows = tl.arange(0, BLOCK_H)
    head0 = kvh * G + ht * BLOCK_H  # the tile's first head; rows past the group are masked
    hmask = ht * BLOCK_H + rows < G
    heads = head0 + rows
    own_cols = v * BLOCK_V + tl.arange(0, BLOCK_V)
    rope_cols = tl.arange(0, ROPE)
    meta = meta_ptr + part * META_FIELDS
    begin_b = tl.load(meta)
    begin_tile = tl.load(meta + 1)
    end_b = tl.load(meta + 2)
    end_tile = tl.load(meta + 3)
    begin_slot = tl.load(meta + 4)
    begin_touched = tl.load(meta + 5) != 0
    end_touched = tl.load(meta + 6) != 0
    for b in range(begin_b, end_b + 1):
        if SPARSE:
            length = TOPK
        else:
            length = tl.load(seqlens_ptr + b)
        lo = tl.where(b == begin_b, begin_tile, 0)
        hi = tl.where(b == end_b, end_tile, tl.cdiv(length, BLOCK_N))
        touched = ((b > begin_b) & (b < end_b)) | ((b == begin_b) & begin_touched) \
            | ((b == end_b) & (b != begin_b) & end_touched)
        if touched:
            q_row = q_ptr + (b * stride_qb + s * stride_qs + head0 * Q_HEAD_STRIDE) + rows[:, None] * Q_HEAD_STRIDE
            qs = _load_q(q_row, 0, hmask, BLOCK_V),
            for c in tl.static_range(1, V_SPLITS):
                qs = qs + (_load_q(q_row, c * BLOCK_V, hmask, BLOCK_V),)
            q_rope = qs[0]
            if HAS_ROPE:
                q_rope = tl.load(q_row + LATENT + rope_cols[None, :], mask=hmask[:, None], other=0.0)
            visible = length
            if CAUSAL:
                visible = tl.minimum(length, length - S_Q + s + 1)
            m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
            l_i = tl.zeros((BLOCK_H,), tl.float32)
            acc = tl.zeros((BLOCK_H, BLOCK_V), tl.float32)
            for tile in range(lo, hi):
                t = tile * BLOCK_N + tl.arange(0, BLOCK_N)
                if SPARSE:
                    slot = tl.load(idx_ptr + b * stride_ib + s * stride_is + t, mask=t < TOPK, other=-1)
                    ok = (slot >= 0) & (slot < NUM_PAGES * PAGE)
                    page = tl.where(ok, slot // PAGE, 0)
                    offset = tl.where(ok, slot % PAGE, 0)
                else:
                    ok = t < visible
                    page = tl.load(table_ptr + b * stride_tb + t // PAGE, mask=ok, other=0)
                    page = tl.minimum(tl.maximum(page, 0), NUM_PAGES - 1)
                    offset = t % PAGE
                base = page.to(tl.int64) * stride_kp + offset * stride_kt + kvh * stride_kh
                ks = _load_latent(kv_ptr, base, ok, 0, BLOCK_V, FP8, LATENT, SCALE_TILE, BLOCK_N, INTERPRET),
                for c in tl.static_range(1, V_SPLITS):
                    ks = ks + (_load_latent(kv_ptr, base, ok, c * BLOCK_V, BLOCK_V, FP8, LATENT, SCALE_TILE, BLOCK_N,
                                            INTERPRET),)
                zero = tl.zeros((BLOCK_H, BLOCK_N), tl.float32)
                # Q.K over the channel blocks in one fixed order in every V split of a head: bit-identical
                # scores (one softmax, one lse) whichever block a program owns
                scores = dot(qs[0], tl.trans(ks[0]), zero, INTERPRET)
                for c in tl.static_range(1, V_SPLITS):
                    scores = dot(qs[c], tl.trans(ks[c]), scores, INTERPRET)
                if HAS_ROPE:
                    k_rope = _load_rope(kv_ptr, base, ok, FP8, LATENT, ROPE, ROPE_OFFSET)
                    scores = dot(q_rope, tl.trans(k_rope), scores, INTERPRET)
                scores = tl.where(ok[None, :], scores * scale_log2, float("-inf"))
                p, m_i, l_i, acc = online_softmax_step(scores, m_i, l_i, acc)
                # P in V's dtype (bf16 for the FP8 cache), with SPLIT_P its rounding error as a second term
                p_hi, p_lo = half_terms(p, SPLIT_P, FP16, INTERPRET)
                k_own = ks[0]
                if V_SPLITS > 1:
                    k_own = _load_latent(kv_ptr, base, ok, v * BLOCK_V, BLOCK_V, FP8, LATENT, SCALE_TILE, BLOCK_N,
                                         INTERPRET)
                acc = accumulate_pv(p_hi, p_lo, k_own, acc, SPLIT_P, INTERPRET)
            has_keys = l_i > 0.0
            o = acc / tl.where(has_keys, l_i, 1.0)[:, None]
            lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) / 1.4426950408889634,
                           float("-inf"))
            splits = tl.load(splits_ptr + b + 1) - tl.load(splits_ptr + b)
            lse_mask = hmask & (rows * 0 + v == 0)  # every V split has the same lse; the first one writes it
            if splits == 1:
                o_ptrs = out_ptr + (b * stride_ob + s * stride_os + head0 * LATENT) + rows[:, None] * LATENT
                tl.store(o_ptrs + own_cols[None, :], to_half(o, FP16, INTERPRET), mask=hmask[:, None])
                tl.store(lse_ptr + b * stride_lb + heads * stride_lh + s,
                         tl.where(has_keys, lse, float("inf")), mask=lse_mask)
            else:
                slot_b = tl.where(b == begin_b, begin_slot, tl.load(splits_ptr + b))
                a_ptrs = oacc_ptr + (slot_b * stride_as + s * stride_aq + head0 * LATENT) + rows[:, None] * LATENT
                tl.store(a_ptrs + own_cols[None, :], o, mask=hmask[:, None])
                tl.store(lacc_ptr + slot_b * stride_las + s * stride_laq + heads, lse, mask=lse_mask)


@serialized
def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor | None,
                           cache_seqlens: torch.Tensor | None, softmax_scale: float, causal: bool,
                           is_fp8_kvcache: bool, indices: torch.Tensor | None, tile_scheduler_metadata: torch.Tensor,
                           num_splits: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *,
                           split_p: bool = True) -> None:
    """Decode into out [b, s_q, h_q, 512] of q's dtype and lse fp32 [b, h_q, s_q] (see the module docstring).

    q: bf16 or fp16 [b, s_q, h_q, d]; a dense k_cache has q's dtype, the FP8 cache (uint8) needs bf16 q.

    The schedule (tile_scheduler_metadata, num_splits) must come from mla_metadata.get_mla_metadata
    for this batch: dense decode over cache_seqlens, sparse over indices.shape[-1].
    """
    _checks.tensor(OP, "q", q, HALF_DTYPES, (None, None, None, None))
    b, s_q, h_q, d = q.shape
    device = q.device
    if d not in (KV_LATENT_DIM, KV_LATENT_DIM + KV_ROPE_DIM):
        _checks.fail(OP, "q", f"of head dim {d}", "576 or 512", "pass MLA queries")
    if is_fp8_kvcache:
        _checks.tensor(OP, "k_cache", k_cache, (torch.uint8,), (None, None, 1, KV_ROPE_OFFSET + 2 * KV_ROPE_DIM),
                       device)
        if d != KV_LATENT_DIM + KV_ROPE_DIM:
            _checks.fail(OP, "q", f"of head dim {d}", "576 with the FP8 cache", "pass 576-dim queries")
        if q.dtype != torch.bfloat16:  # the cache's RoPE part and dequantized latent are bf16
            _checks.fail(OP, "q", f"{q.dtype} with the FP8 cache", "bf16 q", "pass q.to(torch.bfloat16)")
    else:
        _checks.tensor(OP, "k_cache", k_cache, (q.dtype,), (None, None, None, d), device)
    num_pages, page, h_kv = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    if k_cache.stride(-1) != 1 or h_kv < 1 or h_q % h_kv or page < 1:
        _checks.fail(OP, "k_cache", f"of shape {tuple(k_cache.shape)} strides {k_cache.stride()}",
                     "contiguous channels, page >= 1, h_kv dividing h_q", "pass the paged cache")
    sparse = indices is not None
    if sparse:
        _checks.tensor(OP, "indices", indices, (torch.int32,), (b, s_q, None), device)
        _checks.inner_contiguous(OP, "indices", indices)
        if causal or not is_fp8_kvcache or h_kv != 1:
            _checks.fail(OP, "indices", "given here", "sparse decode: FP8 cache, h_kv = 1, causal=False",
                         "pass indices only with the FP8 cache")
    else:
        _checks.tensor(OP, "block_table", block_table, (torch.int32,), (b, None), device)
        _checks.tensor(OP, "cache_seqlens", cache_seqlens, (torch.int32,), (b,), device)
        _checks.inner_contiguous(OP, "block_table", block_table)
    _checks.tensor(OP, "tile_scheduler_metadata", tile_scheduler_metadata, (torch.int32,), (None, META_FIELDS),
                   device)
    _checks.tensor(OP, "num_splits", num_splits, (torch.int32,), (b + 1,), device)
    _checks.tensor(OP, "out", out, (q.dtype,), (b, s_q, h_q, KV_LATENT_DIM), device)
    _checks.tensor(OP, "lse", lse, (torch.float32,), (b, h_q, s_q), device)
    _checks.contiguous(OP, "out", out)
    _checks.contiguous(OP, "lse", lse)
    if out.numel() == 0:
        return
    parts = tile_scheduler_metadata.shape[0]
    q = q if q.stride(-1) == 1 else q.contiguous()
    g = h_q // h_kv
    # a batch is split at most once more per part boundary: b + parts slots bound every schedule
    slots = b + parts
    oacc = torch.empty(slots, s_q, h_q, KV_LATENT_DIM, dtype=torch.float32, device=device)
    lacc = torch.empty(slots, s_q, h_q, dtype=torch.float32, device=device)
    dummy = num_splits
    table = block_table if block_table is not None else dummy[None]
    seqlens = cache_seqlens if cache_seqlens is not None else dummy
    idx = indices if sparse else dummy[None, None]
    head_tiles = triton.cdiv(g, BLOCK_H)
    grid = (parts * V_SPLITS, h_kv * s_q * head_tiles)
    mla_decode_kernel[grid](
        q, k_cache, table, seqlens, idx, tile_scheduler_metadata, num_splits, out, lse, oacc, lacc,
        s_q, g, indices.shape[-1] if sparse else 0, num_pages, page, float(softmax_scale) * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), table.stride(0), idx.stride(0), idx.stride(1), out.stride(0), out.stride(1),
        lse.stride(0), lse.stride(1), oacc.stride(0), oacc.stride(1),
        lacc.stride(0), lacc.stride(1),
        q.stride(2),  # a constexpr: row offsets fold into the loads' immediates instead of live registers
        FP8=is_fp8_kvcache, HAS_ROPE=d > KV_LATENT_DIM, SPARSE=sparse, CAUSAL=causal, LATENT=KV_LATENT_DIM,
        ROPE=KV_ROPE_DIM, ROPE_OFFSET=KV_ROPE_OFFSET, SCALE_TILE=KV_SCALE_TILE, META_FIELDS=META_FIELDS,
        SPLIT_P=split_p, FP16=q.dtype == torch.float16, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, V_SPLITS=V_SPLITS,
        INTERPRET=INTERPRET,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    mla_combine(num_splits, oacc, lacc, out, lse)
