"""MLA decode providers over torch_npu's attention ops (docs/ascend.md, *MLA decode*).

- Atlas A2/A3, dense (bf16 cache, or the FP8 cache dequantized to bf16 at ingest):
  `npu_fused_infer_attention_score` in its MLA form (query/query_rope, key/key_rope), TND layout,
  paged, `softmax_lse_flag=True`.
- Atlas A2/A3, sparse: `npu_sparse_flash_attention` (bf16, MLA-absorb, PA_BSND).
- Ascend 950, FP8 cache in CANN's row order: `npu_kv_quant_sparse_flash_attention`; dense decode is
  the same op over every position of the sequence (indices 0..s_k-1, rightDownCausal for causal).
- Ascend 950, bf16 cache: `npu_sparse_flash_attention` likewise.

Index mapping for the sparse ops: FlashMLA's indices are absolute cache slots; CANN's are positions
in each batch's KV sequence. Handing every batch the identity block table (`arange(num_blocks)`) and
a KV length of `num_blocks·block_size` makes position = slot. CANN wants the valid indices first in
each row, so the -1 entries are moved to the end (a stable sort per row).

The sparse ops return no lse in paged mode; lse is computed here with torch ops on the gathered keys
(one extra QKᵀ pass). What CANN does for a query that sees no key is undocumented: those rows are
set to FlashMLA's answer, out 0 and lse +inf. FIA takes the sequence lengths as host lists, so the
dense A2/A3 provider reads cache_seqlens back to the host (one sync per call).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from portable_kernels.errors import ContractError, format_problem
from portable_kernels.layouts import KV_LATENT_DIM, ascend_kv_to_flashmla, dequantize_fp8_kv_cache

#: CANN's optimized rightDownCausal mask for sparse_mode 3: (2048, 2048), upper triangle masked
CAUSAL_MASK_SIZE = 2048
SPARSE_MODE_FULL, SPARSE_MODE_RIGHT_DOWN_CAUSAL = 0, 3
#: MLA-absorb attention mode, per-tile (128) KV quantization, combined scale storage (KV quant SFA)
ATTENTION_MODE_MLA_ABSORB = 2
KEY_QUANT_MODE_PER_TILE = 2
QUANT_SCALE_REPO_COMBINED = 1
TILE_SIZE = 128
ROPE_HEAD_DIM = 64
_masks: dict[torch.device, torch.Tensor] = {}


def causal_mask(device: torch.device) -> torch.Tensor:
    """The (2048, 2048) bool mask sparse_mode 3 requires (True = masked), built once per device."""
    if device not in _masks:
        _masks[device] = torch.ones(CAUSAL_MASK_SIZE, CAUSAL_MASK_SIZE, dtype=torch.bool, device=device).triu(1)
    return _masks[device]


def _split_cache(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous (nope [nb, bs, 1, 512], rope [nb, bs, 1, 64]) copies of a [nb, bs, 1, 576] bf16 cache:
    the CANN ops refuse non-contiguous key / key_rope, and FlashMLA interleaves them per token."""
    return cache[..., :KV_LATENT_DIM].contiguous(), cache[..., KV_LATENT_DIM:].contiguous()


def dense_mla_fused_infer(npu: Any, q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                          cache_seqlens: torch.Tensor, softmax_scale: float, causal: bool, out: torch.Tensor,
                          lse: torch.Tensor) -> None:
    """A2/A3 dense decode. q bf16 [b, s_q, h_q, 576]; k_cache bf16 [nb, bs, 1, 576]; out [b, s_q, h_q, 512];
    lse [b, h_q, s_q].

    Empty sequences are not sent (out 0, lse +inf). A causal batch with fewer keys than queries would
    block CANN's rightDownCausal mode ("actual_seq_lengths_kv - actual_seq_lengths < 0"), so such
    batches go through npu_sparse_flash_attention over their positions instead.
    """
    b, s_q, h_q, _ = q.shape
    nb, bs = k_cache.shape[0], k_cache.shape[1]
    seqlens = [int(v) for v in cache_seqlens.tolist()]  # FIA takes host lists
    out.zero_()
    lse.fill_(math.inf)
    short = [i for i, n in enumerate(seqlens) if 0 < n < s_q and causal]
    full = [i for i, n in enumerate(seqlens) if n > 0 and i not in short]
    nope, rope = _split_cache(k_cache)
    if full:
        rows = torch.tensor(full, device=q.device)
        qs = q.index_select(0, rows).reshape(len(full) * s_q, h_q, -1)
        sparse_mode = SPARSE_MODE_RIGHT_DOWN_CAUSAL if causal and s_q > 1 else SPARSE_MODE_FULL
        attn, softmax_lse = npu.npu_fused_infer_attention_score(
            qs[..., :KV_LATENT_DIM].contiguous(), nope.view(nb, bs, KV_LATENT_DIM), nope.view(nb, bs, KV_LATENT_DIM),
            query_rope=qs[..., KV_LATENT_DIM:].contiguous(), key_rope=rope.view(nb, bs, -1),
            atten_mask=causal_mask(q.device) if sparse_mode == SPARSE_MODE_RIGHT_DOWN_CAUSAL else None,
            actual_seq_lengths=[s_q * (j + 1) for j in range(len(full))],
            actual_seq_lengths_kv=[seqlens[i] for i in full], block_table=block_table.index_select(0, rows).contiguous(),
            num_heads=h_q, scale=softmax_scale, input_layout="TND", num_key_value_heads=1, sparse_mode=sparse_mode,
            block_size=bs, softmax_lse_flag=True)
        out.index_copy_(0, rows, attn.view(len(full), s_q, h_q, -1).to(out.dtype))
        lse.index_copy_(0, rows, softmax_lse.view(len(full), s_q, h_q).permute(0, 2, 1).to(lse.dtype))
    if short:
        rows = torch.tensor(short, device=q.device)
        lengths = cache_seqlens.index_select(0, rows)
        indices, mode = dense_as_sparse_indices(lengths, s_q, causal)
        o = torch.empty(len(short), s_q, h_q, out.shape[-1], dtype=out.dtype, device=out.device)
        l_ = torch.empty(len(short), h_q, s_q, dtype=lse.dtype, device=lse.device)
        sparse_mla_bf16(npu, q.index_select(0, rows), k_cache, indices, softmax_scale, o, l_,
                        block_table=block_table.index_select(0, rows).contiguous(), kv_lengths=lengths,
                        sparse_mode=mode, split=(nope, rope))
        out.index_copy_(0, rows, o)
        lse.index_copy_(0, rows, l_)


def valid_first(indices: torch.Tensor) -> torch.Tensor:
    """int32 [b, s_q, 1, topk] with each row's -1 entries moved after its valid ones (order kept)."""
    order = torch.sort((indices < 0).to(torch.int8), dim=-1, stable=True).indices
    return indices.gather(-1, order).unsqueeze(2).contiguous()


def identity_paging(b: int, num_blocks: int, block_size: int, device: torch.device):
    """(block_table int32 [b, num_blocks] = arange, kv lengths int32 [b] = num_blocks·block_size)."""
    table = torch.arange(num_blocks, dtype=torch.int32, device=device).expand(b, num_blocks).contiguous()
    return table, torch.full((b,), num_blocks * block_size, dtype=torch.int32, device=device)


def dense_as_sparse_indices(cache_seqlens: torch.Tensor, s_q: int, causal: bool) -> tuple[torch.Tensor, int]:
    """Dense decode as sparse decode over every position: int32 [b, s_q, 1, S] with positions
    0..s_k-1 (positions past s_k are -1), and the sparse_mode that adds FlashMLA's causal mask.
    The sequences keep their own block tables and lengths. S = max(cache_seqlens) is read on the host."""
    s_max = max(int(cache_seqlens.max()), 1) if cache_seqlens.numel() else 1
    pos = torch.arange(s_max, dtype=torch.int32, device=cache_seqlens.device)
    idx = torch.where(pos[None, :] < cache_seqlens[:, None], pos[None, :], -1)
    mode = SPARSE_MODE_RIGHT_DOWN_CAUSAL if causal and s_q > 1 else SPARSE_MODE_FULL
    return idx[:, None, None, :].expand(-1, s_q, 1, -1).contiguous(), mode


def _lse_and_empty_rows(q: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor, softmax_scale: float,
                        out: torch.Tensor, lse: torch.Tensor) -> None:
    """lse [b, h_q, s_q] from q [b, s_q, h_q, 576] and gathered keys [b, s_q, L, 576] (fp32), visible
    [b, s_q, L]; rows that see nothing get out 0 and lse +inf (FlashMLA's rule)."""
    logits = torch.einsum("bqhd,bqkd->bqhk", q.float(), keys) * softmax_scale
    logits = logits.masked_fill(~visible[:, :, None, :], -math.inf)
    row_lse = torch.logsumexp(logits, dim=-1)                                   # [b, s_q, h_q]
    empty = ~visible.any(-1)                                                    # [b, s_q]
    row_lse = row_lse.masked_fill(empty[..., None], math.inf)
    lse.copy_(row_lse.transpose(1, 2))
    out.masked_fill_(empty[:, :, None, None], 0.0)


def _gather_rows(cache: torch.Tensor, slots: torch.Tensor, ascend_fp8: bool) -> torch.Tensor:
    """fp32 [.., 576] keys at absolute slots (-1 read as slot 0, masked by the caller)."""
    flat = cache.reshape(cache.shape[0] * cache.shape[1], cache.shape[-1])
    rows = flat[slots.clamp_min(0).long()]
    if ascend_fp8:
        return dequantize_fp8_kv_cache(ascend_kv_to_flashmla(rows), torch.float32)
    return rows.float()


def sparse_mla_bf16(npu: Any, q: torch.Tensor, k_cache: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
                    out: torch.Tensor, lse: torch.Tensor, block_table: torch.Tensor | None = None,
                    kv_lengths: torch.Tensor | None = None, sparse_mode: int = SPARSE_MODE_FULL,
                    split: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """bf16 cache [nb, bs, 1, 576] through npu_sparse_flash_attention. `indices` int32 [b, s_q, topk] are
    absolute slots (identity paging), or int32 [b, s_q, 1, L] positions with `block_table` / `kv_lengths`.
    `split`: the cache's contiguous (nope, rope) halves when the caller already made them."""
    b, s_q, h_q, _ = q.shape
    nb, bs = k_cache.shape[0], k_cache.shape[1]
    if block_table is None:
        block_table, kv_lengths = identity_paging(b, nb, bs, q.device)
    sparse = valid_first(indices) if indices.dim() == 3 else indices
    nope, rope = split if split is not None else _split_cache(k_cache)
    attn = npu.npu_sparse_flash_attention(
        q[..., :KV_LATENT_DIM].contiguous(), nope, nope, sparse, softmax_scale, block_table=block_table,
        actual_seq_lengths_kv=kv_lengths, query_rope=q[..., KV_LATENT_DIM:].contiguous(), key_rope=rope,
        sparse_block_size=1, layout_query="BSND", layout_kv="PA_BSND", sparse_mode=sparse_mode,
        attention_mode=ATTENTION_MODE_MLA_ABSORB, return_softmax_lse=False)[0]
    out.copy_(attn)
    _finish_sparse(q, k_cache, sparse, block_table, softmax_scale, sparse_mode, kv_lengths, False, out, lse)


def sparse_mla_fp8(npu: Any, q: torch.Tensor, k_cache_ascend: torch.Tensor, indices: torch.Tensor,
                   softmax_scale: float, out: torch.Tensor, lse: torch.Tensor, block_table: torch.Tensor | None = None,
                   kv_lengths: torch.Tensor | None = None, sparse_mode: int = SPARSE_MODE_FULL) -> None:
    """Ascend 950: uint8 [nb, bs, 1, 656] cache in CANN's [nope | rope | scales] order through
    npu_kv_quant_sparse_flash_attention (keys passed as float8_e4m3fn, per-tile 128 scales)."""
    b = q.shape[0]
    nb, bs = k_cache_ascend.shape[0], k_cache_ascend.shape[1]
    if block_table is None:
        block_table, kv_lengths = identity_paging(b, nb, bs, q.device)
    sparse = valid_first(indices) if indices.dim() == 3 else indices
    keys = k_cache_ascend.view(torch.float8_e4m3fn)
    attn = npu.npu_kv_quant_sparse_flash_attention(
        q.contiguous(), keys, keys, sparse, softmax_scale, KEY_QUANT_MODE_PER_TILE, KEY_QUANT_MODE_PER_TILE,
        block_table=block_table, actual_seq_lengths_kv=kv_lengths, sparse_block_size=1, layout_query="BSND",
        layout_kv="PA_BSND", sparse_mode=sparse_mode, attention_mode=ATTENTION_MODE_MLA_ABSORB,
        quant_scale_repo_mode=QUANT_SCALE_REPO_COMBINED, tile_size=TILE_SIZE, rope_head_dim=ROPE_HEAD_DIM)
    out.copy_(attn)
    _finish_sparse(q, k_cache_ascend, sparse, block_table, softmax_scale, sparse_mode, kv_lengths, True, out, lse)


def _finish_sparse(q, cache, sparse, block_table, softmax_scale, sparse_mode, kv_lengths, ascend_fp8, out, lse):
    """lse (and empty rows) for a sparse call: positions -> absolute slots through block_table."""
    b, s_q = q.shape[0], q.shape[1]
    bs = cache.shape[1]
    pos = sparse[:, :, 0, :].long()                                             # [b, s_q, L]
    visible = pos >= 0
    if sparse_mode == SPARSE_MODE_RIGHT_DOWN_CAUSAL:
        last = kv_lengths.long()[:, None] - s_q + torch.arange(s_q, device=q.device)
        visible &= pos <= last[:, :, None]
    p = pos.clamp_min(0)
    slots = block_table.long().gather(1, (p // bs).flatten(1)).view_as(p) * bs + p % bs
    keys = _gather_rows(cache, torch.where(visible, slots, -1), ascend_fp8)
    _lse_and_empty_rows(q, keys, visible, softmax_scale, out, lse)
