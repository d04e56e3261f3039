"""MLA decode providers over torch_npu's attention ops (docs/ascend.md, *MLA decode*).

Every call first gathers the cache tokens it reads into a compact paged cache shaped the way the
CANN op wants it (one pass over the read set, never over the whole cache):

- bf16 rows [nope 512 | rope 64] as they are — a bf16 cache, or on Atlas A2/A3 the FP8 cache stored
  as its exact values (`layouts.ASCEND_BF16_KV`, dequantized once by prepare_inputs or written so by
  write_kv_cache) — split into the contiguous `key` / `key_rope` tensors the ops require;
- or, on Ascend 950, the FP8 rows as they are: the cache is already in CANN's order
  [nope | rope | scales] (`layouts.ASCEND_FP8_KV`, converted once by prepare_inputs or written so by
  write_kv_cache).
Nothing here converts a cache: one in another Format is converted by the op before the provider
(counted by implicit_conversions()), and rows in the wrong storage raise ValueError.

`cache_format` is the KV-cache Format of the cache handed in (the backend's `kv_cache_format`; None
for a bf16 cache).

The compact cache gets identity block tables, so FlashMLA's absolute cache slots (sparse `indices`)
become positions 0..L-1 of each batch's compact sequence, which is what CANN's indices are; -1
entries are moved after the valid ones in each row (CANN: valid first, invalid after).

Ops: Atlas A2/A3 dense -> `npu_fused_infer_attention_score` (MLA form, TND);
A2/A3 sparse and Ascend 950 bf16 -> `npu_sparse_flash_attention`; Ascend 950 FP8 ->
`npu_kv_quant_sparse_flash_attention` (dense decode = sparse decode over every position). None of
them gives lse here (FIA: "不支持softmax_lse" for MLA D = 512; the sparse ops: no lse in paged mode),
so lse comes from torch ops on the compact rows (one extra QKᵀ pass). A query that sees no key gets FlashMLA's out 0 / lse +inf (CANN's result is undocumented).
The longest sequence (dense) and FIA's length lists are read back to the host: one sync per call.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from portable_kernels.layouts import ASCEND_FP8_KV, KV_LATENT_DIM, KVCacheFormat

#: CANN's optimized rightDownCausal mask for sparse_mode 3: (2048, 2048), upper triangle masked
CAUSAL_MASK_SIZE = 2048
SPARSE_MODE_FULL, SPARSE_MODE_RIGHT_DOWN_CAUSAL = 0, 3
#: MLA-absorb attention mode, per-tile (128) KV quantization, combined scale storage (KV quant SFA)
ATTENTION_MODE_MLA_ABSORB = 2
KEY_QUANT_MODE_PER_TILE = 2
QUANT_SCALE_REPO_COMBINED = 1
TILE_SIZE = 128
ROPE_HEAD_DIM = 64
#: block size of the compact caches (CANN: a multiple of 16, <= 1024)
COMPACT_BLOCK = 64
#: head counts the A2/A3 MLA kernels take (FIA / SFA docs)
A2A3_MLA_HEADS = (1, 2, 4, 8, 16, 32, 64, 128)
_masks: dict[torch.device, torch.Tensor] = {}


def causal_mask(device: torch.device) -> torch.Tensor:
    """The (2048, 2048) bool mask sparse_mode 3 requires (True = masked), built once per device."""
    if device not in _masks:
        _masks[device] = torch.ones(CAUSAL_MASK_SIZE, CAUSAL_MASK_SIZE, dtype=torch.bool, device=device).triu(1)
    return _masks[device]


# -- compact caches -------------------------------------------------------------------------------------

def _rows(k_cache: torch.Tensor, slots: torch.Tensor, valid: torch.Tensor, form: str,
          cache_format: KVCacheFormat | None) -> torch.Tensor:
    """Cache rows at absolute `slots` as they are stored ("bf16": [.., 576] bf16 rows — a bf16 cache or
    ASCEND_BF16_KV; "ascend-fp8": [.., 656] uint8 in CANN's order); invalid entries read slot 0 and
    are zeroed. Rows in another storage raise ValueError: the op converts before the provider."""
    if form == "ascend-fp8" and cache_format is not ASCEND_FP8_KV:
        raise ValueError(f"the KV-quant op reads rows in {ASCEND_FP8_KV.name} order, got a "
                         f"{getattr(cache_format, 'name', 'bf16')} cache (flash_mla_with_kvcache converts the "
                         f"cache before the provider)")
    if form == "bf16" and (k_cache.dtype != torch.bfloat16 or not (cache_format is None or cache_format.holds_values)):
        raise ValueError(f"the bf16 MLA ops read bf16 rows, got a {k_cache.dtype} "
                         f"{getattr(cache_format, 'name', '')} cache (on Atlas A2/A3 the FP8 cache is stored as its "
                         f"values, layouts.ASCEND_BF16_KV; flash_mla_with_kvcache converts before the provider)")
    flat = k_cache.reshape(k_cache.shape[0] * k_cache.shape[1], k_cache.shape[-1])
    rows = flat[torch.where(valid, slots, 0).long()]
    return torch.where(valid[..., None], rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


def _paged(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, L, D] rows -> (cache [b·ceil(L/64), 64, 1, D], identity block_table int32 [b, ceil(L/64)])."""
    b, length, d = rows.shape
    per = max(1, -(-length // COMPACT_BLOCK))
    padded = rows.new_zeros(b, per * COMPACT_BLOCK, d)
    padded[:, :length] = rows
    table = torch.arange(b * per, dtype=torch.int32, device=rows.device).view(b, per)
    return padded.view(b * per, COMPACT_BLOCK, 1, d), table


def compact_dense(k_cache: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor, form: str,
                  cache_format: KVCacheFormat | None = None):
    """The tokens of every sequence, compacted: (cache, block_table, lengths int32 [b], rows [b, S, D])."""
    b, bs = cache_seqlens.shape[0], k_cache.shape[1]
    s_max = max(int(cache_seqlens.max()), 1) if b else 1
    pos = torch.arange(s_max, device=k_cache.device)
    valid = pos[None, :] < cache_seqlens[:, None]
    blocks = block_table.long().gather(1, torch.where(valid, pos // bs, 0))
    rows = _rows(k_cache, blocks * bs + pos % bs, valid, form, cache_format)
    cache, table = _paged(rows)
    return cache, table, cache_seqlens.to(torch.int32), rows


def compact_sparse(k_cache: torch.Tensor, indices: torch.Tensor, form: str,
                   cache_format: KVCacheFormat | None = None):
    """The slots named by `indices` [b, s_q, topk], compacted per batch: (cache, block_table, lengths,
    positions int32 [b, s_q, 1, topk] valid-first, rows [b, s_q·topk, D], visible [b, s_q, topk])."""
    b, s_q, topk = indices.shape
    valid = indices >= 0
    rows = _rows(k_cache, indices.reshape(b, s_q * topk), valid.reshape(b, s_q * topk), form, cache_format)
    cache, table = _paged(rows)
    pos = torch.arange(s_q * topk, dtype=torch.int32, device=indices.device).view(1, s_q, topk)
    positions = torch.where(valid, pos, -1)
    lengths = torch.full((b,), s_q * topk, dtype=torch.int32, device=indices.device)
    return cache, table, lengths, valid_first(positions), rows, valid


def valid_first(indices: torch.Tensor) -> torch.Tensor:
    """int32 [b, s_q, 1, topk] with each row's -1 entries moved after its valid ones (order kept)."""
    order = torch.sort((indices < 0).to(torch.int8), dim=-1, stable=True).indices
    return indices.gather(-1, order).unsqueeze(2).contiguous()


def _split(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous nope [.., 512] and rope [.., 64] of a bf16 [.., 576] cache (the ops refuse strided keys)."""
    return cache[..., :KV_LATENT_DIM].contiguous(), cache[..., KV_LATENT_DIM:].contiguous()


# -- lse and empty rows ----------------------------------------------------------------------------------

def _lse_and_empty_rows(q: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor, softmax_scale: float,
                        out: torch.Tensor, lse: torch.Tensor) -> None:
    """lse [b, h_q, s_q] from q [b, s_q, h_q, 576] and keys fp32 [b, s_q or 1, L, 576] visible [b, s_q, L];
    rows that see nothing get out 0 and lse +inf (FlashMLA's rule)."""
    logits = torch.einsum("bqhd,bqkd->bqhk", q.float(), keys.expand(-1, q.shape[1], -1, -1)) * softmax_scale
    logits = logits.masked_fill(~visible[:, :, None, :], -math.inf)
    row_lse = torch.logsumexp(logits, dim=-1)                                   # [b, s_q, h_q]
    empty = ~visible.any(-1)                                                    # [b, s_q]
    lse.copy_(row_lse.masked_fill(empty[..., None], math.inf).transpose(1, 2))
    out.masked_fill_(empty[:, :, None, None], 0.0)


def _row_keys(rows: torch.Tensor) -> torch.Tensor:
    """fp32 [.., 576] keys of compact rows (CANN-order FP8 rows dequantized)."""
    if rows.dtype == torch.uint8:
        return ASCEND_FP8_KV.dequantize(rows, torch.float32)
    return rows.float()


def _dense_visible(lengths: torch.Tensor, s_q: int, s_max: int, causal: bool) -> torch.Tensor:
    pos = torch.arange(s_max, device=lengths.device)
    visible = (pos[None, None, :] < lengths[:, None, None]).expand(-1, s_q, -1)
    if causal:
        last = lengths.long()[:, None] - s_q + torch.arange(s_q, device=lengths.device)
        visible = visible & (pos[None, None, :] <= last[:, :, None])
    return visible


def dense_positions(lengths: torch.Tensor, s_q: int, s_max: int) -> torch.Tensor:
    """int32 [b, s_q, 1, S]: positions 0..s_k-1 of each sequence, -1 past its end (dense as sparse)."""
    pos = torch.arange(s_max, dtype=torch.int32, device=lengths.device)
    idx = torch.where(pos[None, :] < lengths[:, None], pos[None, :], -1)
    return idx[:, None, None, :].expand(-1, s_q, 1, -1).contiguous()


# -- the CANN calls ----------------------------------------------------------------------------------------

def _sfa_bf16(npu, q, cache, table, lengths, positions, mode, scale):
    nope, rope = _split(cache)
    return npu.npu_sparse_flash_attention(
        q[..., :KV_LATENT_DIM].contiguous(), nope, nope, positions, scale, block_table=table,
        actual_seq_lengths_kv=lengths, query_rope=q[..., KV_LATENT_DIM:].contiguous(), key_rope=rope,
        sparse_block_size=1, layout_query="BSND", layout_kv="PA_BSND", sparse_mode=mode,
        attention_mode=ATTENTION_MODE_MLA_ABSORB, return_softmax_lse=False)[0]


def _sfa_fp8(npu, q, cache, table, lengths, positions, mode, scale):
    keys = cache.view(torch.float8_e4m3fn)
    return npu.npu_kv_quant_sparse_flash_attention(
        q.contiguous(), keys, keys, positions, scale, KEY_QUANT_MODE_PER_TILE, KEY_QUANT_MODE_PER_TILE,
        block_table=table, actual_seq_lengths_kv=lengths, sparse_block_size=1, layout_query="BSND",
        layout_kv="PA_BSND", sparse_mode=mode, attention_mode=ATTENTION_MODE_MLA_ABSORB,
        quant_scale_repo_mode=QUANT_SCALE_REPO_COMBINED, tile_size=TILE_SIZE, rope_head_dim=ROPE_HEAD_DIM)


def sparse_decode(npu: Any, q: torch.Tensor, k_cache: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
                  out: torch.Tensor, lse: torch.Tensor, fp8_op: bool,
                  cache_format: KVCacheFormat | None = None) -> None:
    """Sparse decode (FlashMLA's absolute-slot `indices` [b, s_q, topk]). fp8_op: Ascend 950's KV-quant op
    on a CANN-order FP8 cache (cache_format ASCEND_FP8_KV); else npu_sparse_flash_attention on bf16 rows."""
    form = "ascend-fp8" if fp8_op else "bf16"
    cache, table, lengths, positions, rows, visible = compact_sparse(k_cache, indices, form, cache_format)
    call = _sfa_fp8 if fp8_op else _sfa_bf16
    out.copy_(call(npu, q, cache, table, lengths, positions, SPARSE_MODE_FULL, softmax_scale))
    b, s_q, topk = indices.shape
    keys = _row_keys(rows).view(b, s_q, topk, -1)
    _lse_and_empty_rows(q, keys, visible, softmax_scale, out, lse)


def dense_decode_as_sparse(npu: Any, q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                           cache_seqlens: torch.Tensor, softmax_scale: float, causal: bool, out: torch.Tensor,
                           lse: torch.Tensor, fp8_op: bool, cache_format: KVCacheFormat | None = None) -> None:
    """Dense decode through a sparse op over every position 0..s_k-1 (sparse_mode 3 for causal)."""
    s_q = q.shape[1]
    form = "ascend-fp8" if fp8_op else "bf16"
    cache, table, lengths, rows = compact_dense(k_cache, block_table, cache_seqlens, form, cache_format)
    s_max = rows.shape[1]
    mode = SPARSE_MODE_RIGHT_DOWN_CAUSAL if causal and s_q > 1 else SPARSE_MODE_FULL
    call = _sfa_fp8 if fp8_op else _sfa_bf16
    out.copy_(call(npu, q, cache, table, lengths, dense_positions(lengths, s_q, s_max), mode, softmax_scale))
    visible = _dense_visible(lengths, s_q, s_max, causal and s_q > 1)
    _lse_and_empty_rows(q, _row_keys(rows)[:, None], visible, softmax_scale, out, lse)


def dense_decode_fused_infer(npu: Any, q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                             cache_seqlens: torch.Tensor, softmax_scale: float, causal: bool, out: torch.Tensor,
                             lse: torch.Tensor, cache_format: KVCacheFormat | None = None) -> None:
    """Atlas A2/A3 dense decode through npu_fused_infer_attention_score (MLA, TND).

    lse does not come from the op: its MLA constraints for query D = 512 (every layout, TND
    included) list softmax_lse as not supported (torch_npu-npu_fused_infer_attention_score.md,
    MLA约束, master and 26.1.0), so it is computed with torch ops on the compact rows, as for the
    sparse ops. Causal batches with fewer keys than queries go to the op too: the "blocks execution"
    rule for actual_seq_lengths_kv - actual_seq_lengths < 0 under sparse_mode 3 applies to int8 output
    with quant_offset2 only (约束说明), and the queries that see no key there get out 0 / lse +inf
    here (what the op writes for them is undocumented). Empty sequences are not sent.
    """
    b, s_q, h_q, _ = q.shape
    seqlens = [int(v) for v in cache_seqlens.tolist()]  # FIA takes host lists
    out.zero_()
    lse.fill_(math.inf)
    full = [i for i, n in enumerate(seqlens) if n > 0]
    if not full:
        return
    rows_idx = torch.tensor(full, device=q.device)
    lengths = cache_seqlens.index_select(0, rows_idx)
    cache, table, lengths32, rows = compact_dense(k_cache, block_table.index_select(0, rows_idx), lengths, "bf16",
                                                  cache_format)
    nope, rope = _split(cache)
    nb = cache.shape[0]
    q_sel = q.index_select(0, rows_idx)
    qs = q_sel.reshape(len(full) * s_q, h_q, -1)
    mode = SPARSE_MODE_RIGHT_DOWN_CAUSAL if causal and s_q > 1 else SPARSE_MODE_FULL
    attn, _ = npu.npu_fused_infer_attention_score(
        qs[..., :KV_LATENT_DIM].contiguous(), nope.view(nb, COMPACT_BLOCK, -1), nope.view(nb, COMPACT_BLOCK, -1),
        query_rope=qs[..., KV_LATENT_DIM:].contiguous(), key_rope=rope.view(nb, COMPACT_BLOCK, -1),
        atten_mask=causal_mask(q.device) if mode == SPARSE_MODE_RIGHT_DOWN_CAUSAL else None,
        actual_seq_lengths=[s_q * (j + 1) for j in range(len(full))],
        actual_seq_lengths_kv=[seqlens[i] for i in full], block_table=table, num_heads=h_q, scale=softmax_scale,
        input_layout="TND", num_key_value_heads=1, sparse_mode=mode, block_size=COMPACT_BLOCK,
        softmax_lse_flag=False)
    o = attn.view(len(full), s_q, h_q, -1).to(out.dtype)
    l_ = torch.empty(len(full), h_q, s_q, dtype=lse.dtype, device=lse.device)
    visible = _dense_visible(lengths32, s_q, rows.shape[1], mode == SPARSE_MODE_RIGHT_DOWN_CAUSAL)
    _lse_and_empty_rows(q_sel, _row_keys(rows)[:, None], visible, softmax_scale, o, l_)
    out.index_copy_(0, rows_idx, o)
    lse.index_copy_(0, rows_idx, l_)
