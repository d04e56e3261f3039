"""Stand-ins for the MLA attention ops the providers call, in their paged MLA forms.

- `npu_fused_infer_attention_score`: MLA (`query_rope` / `key_rope`, D = 512 + 64), `input_layout="TND"`,
  PagedAttention with `block_table`, `sparse_mode` 0 or 3 (3 = rightDownCausal, needs the optimized
  (2048, 2048) `atten_mask`; fewer keys than queries allowed, those queries NaN), no softmax_lse
  (MLA约束, D = 512: "不支持：softmax_lse"). Atlas A2/A3 only (26.1.0 / master docs).
- `npu_sparse_flash_attention`: MLA-absorb (`attention_mode=2`), `layout_kv="PA_BSND"`, bf16; no lse
  in paged mode (`return_softmax_lse` is for training without PA).
- `npu_kv_quant_sparse_flash_attention`: 656-byte rows [nope | rope | 4 fp32 scales], per-tile (128)
  dequantization; `float8_e4m3fn` keys on Ascend 950 only, int8 on A2/A3 (master docs).

What the docs leave open is returned as NaN so a provider cannot lean on it: a query that sees no
key (an empty sequence, or a sparse row of only invalid indices).
"""

from __future__ import annotations

import math

import torch

from ._common import require

MLA_HEADS_A2A3 = (1, 2, 4, 8, 16, 32, 64, 128)
NOPE, ROPE = 512, 64
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


def _paged_positions(block_table: torch.Tensor, batch: int, positions: torch.Tensor, block_size: int):
    """(block, offset) of the batch's sequence positions through its block_table row."""
    return block_table[batch, positions // block_size].long(), positions % block_size


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float):
    """q [S, N, Dk], k [S or 1.., L, Dk] broadcast per query, v likewise -> (out [S, N, Dv], lse [S, N]).

    Rows with nothing visible come back NaN (undocumented in CANN)."""
    logits = torch.einsum("snd,sld->snl", q.double(), k.double()) * scale
    logits = logits.masked_fill(~visible[:, None, :], -math.inf)
    lse = torch.logsumexp(logits, dim=-1)
    out = torch.einsum("snl,slv->snv", torch.exp(logits - lse[..., None]), v.double())
    empty = ~visible.any(-1)
    out[empty] = math.nan
    lse[empty] = math.nan
    return out, lse


class FusedInferAttention:
    def __init__(self, owner) -> None:
        self.owner = owner

    def __call__(self, query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
                 actual_seq_lengths_kv=None, block_table=None, query_rope=None, key_rope=None, num_heads=1,
                 scale=1.0, pre_tokens=INT32_MAX, next_tokens=INT32_MAX, input_layout="BSH", num_key_value_heads=0,
                 sparse_mode=0, inner_precise=0, block_size=0, softmax_lse_flag=False, **others):
        self.owner.record("npu_fused_infer_attention_score")
        require(self.owner.chip == "a2a3", "npu_fused_infer_attention_score: Atlas A2/A3 only (torch_npu docs list "
                                           "no Ascend 950 support)")
        require(all(v is None for v in others.values()), f"stand-in: {sorted(others)} are not implemented")
        require(pse_shift is None, "npu_fused_infer_attention_score MLA: pse is not supported")
        require(input_layout == "TND", "stand-in: only the TND layout of the MLA form is implemented")
        require(query_rope is not None and key_rope is not None,
                "npu_fused_infer_attention_score: query_rope and key_rope are given together (MLA)")
        for name, t in (("query", query), ("key", key), ("value", value), ("query_rope", query_rope),
                        ("key_rope", key_rope)):
            require(t.is_contiguous(), f"npu_fused_infer_attention_score: {name} must be contiguous")
            require(t.dtype == query.dtype and t.dtype in (torch.float16, torch.bfloat16),
                    f"npu_fused_infer_attention_score: {name} must be fp16/bf16 like query")
        t_tokens, n, d = query.shape
        require(d == NOPE and tuple(query_rope.shape) == (t_tokens, n, ROPE),
                "npu_fused_infer_attention_score MLA: query D 512, query_rope D 64, other dims equal")
        require(n == num_heads and n in MLA_HEADS_A2A3, f"npu_fused_infer_attention_score MLA: num_heads must be "
                f"query's N and one of {MLA_HEADS_A2A3}")
        require(num_key_value_heads == 1, "npu_fused_infer_attention_score MLA: key N must be 1")
        require(block_table is not None and block_table.dtype == torch.int32 and block_table.dim() == 2,
                "stand-in: only the PagedAttention form (int32 2-D block_table) is implemented")
        require(key.dim() == 3 and key.shape[2] == NOPE and value.shape == key.shape,
                "npu_fused_infer_attention_score PA: key/value (blocknum, blocksize, H = 512)")
        nb, bs, _ = key.shape
        require(tuple(key_rope.shape) == (nb, bs, ROPE), "npu_fused_infer_attention_score MLA: key_rope D 64, other "
                                                         "dims like key")
        require(block_size == bs and bs % 16 == 0 and 0 < bs <= 1024,
                "npu_fused_infer_attention_score MLA PA: block_size a multiple of 16, <= 1024, equal to the cache's")
        require(sparse_mode in (0, 3), "npu_fused_infer_attention_score MLA D=512: sparse_mode 0, 3 or 4 (stand-in: "
                                       "0 and 3)")
        require(not softmax_lse_flag, "npu_fused_infer_attention_score MLA, query D = 512: softmax_lse is not "
                                      "supported (MLA约束, D = 512: 不支持softmax_lse; every layout, TND included)")
        if sparse_mode == 3:
            require(atten_mask is not None and atten_mask.dtype in (torch.bool, torch.int8, torch.uint8)
                    and tuple(atten_mask.shape) == (2048, 2048)
                    and torch.equal(atten_mask.bool(), torch.ones(2048, 2048, dtype=torch.bool).triu(1)),
                    "npu_fused_infer_attention_score: sparse_mode 3 needs the optimized (2048, 2048) atten_mask "
                    "(upper triangle masked)")
        else:
            require(atten_mask is None, "stand-in: a user atten_mask with sparse_mode 0 is not implemented")
        q_cum = list(actual_seq_lengths or [])
        kv_len = list(actual_seq_lengths_kv or [])
        b = len(q_cum)
        require(0 < b <= 4096 and len(kv_len) == b,
                "npu_fused_infer_attention_score TND: actual_seq_lengths and actual_seq_lengths_kv, batch <= 4096")
        require(all(x <= y for x, y in zip([0] + q_cum, q_cum)) and q_cum[-1] == t_tokens,
                "npu_fused_infer_attention_score TND: actual_seq_lengths is a non-decreasing prefix sum ending at T")
        require(block_table.shape[0] == b and all(0 <= L <= block_table.shape[1] * bs for L in kv_len),
                "npu_fused_infer_attention_score PA: block_table [B, >= maxBlockNumPerSeq]")
        out = torch.empty(t_tokens, n, NOPE, dtype=torch.float64)
        lse = torch.empty(t_tokens, n, dtype=torch.float64)
        start = 0
        for i in range(b):
            s_q, s_k = q_cum[i] - start, kv_len[i]
            # sparse_mode 3 with fewer keys than queries is allowed: the "blocks execution" rule for
            # actual_seq_lengths_kv - actual_seq_lengths < 0 is for int8 output with quant_offset2 (约束说明),
            # which this stand-in does not implement; the queries that see no key come back NaN
            pos = torch.arange(s_k)
            blocks, offs = _paged_positions(block_table, i, pos, bs)
            k_full = torch.cat((key[blocks, offs], key_rope[blocks, offs]), -1)      # [s_k, 576]
            v = value[blocks, offs]                                                 # [s_k, 512]
            q = torch.cat((query[start:start + s_q], query_rope[start:start + s_q]), -1)
            visible = torch.ones(s_q, s_k, dtype=torch.bool)
            if sparse_mode == 3:
                visible = pos[None, :] <= (s_k - s_q + torch.arange(s_q))[:, None]
            o, s = _attend(q, k_full[None].expand(s_q, -1, -1), v[None].expand(s_q, -1, -1), visible, scale)
            out[start:start + s_q], lse[start:start + s_q] = o, s
            start = q_cum[i]
        return out.to(query.dtype), torch.zeros(1)  # softmax_lse_flag=False: "shape (1,)，值为0的Tensor"


def _check_sparse_common(owner, name, query, block_table, actual_seq_lengths_kv, sparse_indices, layout_query,
                         layout_kv, sparse_mode, pre_tokens, next_tokens, attention_mode, sparse_block_size, heads,
                         key_block_size, max_sparse_block=128):
    require(layout_query == "BSND" and layout_kv == "PA_BSND", f"stand-in {name}: only BSND query with PA_BSND kv")
    require(attention_mode == 2, f"{name}: attention_mode must be 2 (MLA-absorb)")
    require(sparse_mode in (0, 3), f"{name}: sparse_mode 0 or 3")
    require(pre_tokens == INT64_MAX and next_tokens == INT64_MAX, f"{name}: pre/next_tokens take the default only")
    if owner.chip == "950":
        require(sparse_block_size == 1, f"{name}: Ascend 950 supports sparse_block_size 1 only")
    else:
        # SFA 约束说明 A2/A3: [1, 128], a power of two; KV-quant SFA 约束说明 A2/A3: [1, 16]; both dividing block_size
        require(1 <= sparse_block_size <= max_sparse_block and sparse_block_size & (sparse_block_size - 1) == 0
                and key_block_size % sparse_block_size == 0,
                f"{name}: sparse_block_size a power of two in [1, {max_sparse_block}] dividing block_size")
    b, s1, n1, _ = query.shape
    require(n1 in heads, f"{name}: query N must be one of {heads}")
    require(key_block_size % 16 == 0 and 0 < key_block_size <= 1024, f"{name}: block_size multiple of 16, <= 1024")
    require(isinstance(sparse_indices, torch.Tensor) and sparse_indices.dtype == torch.int32
            and sparse_indices.dim() == 4 and tuple(sparse_indices.shape[:3]) == (b, s1, 1)
            and sparse_indices.shape[3] > 0 and sparse_indices.is_contiguous(),
            f"{name}: sparse_indices int32 [B, Q_S, KV_N = 1, sparse_size > 0], contiguous")
    require(block_table is not None and block_table.dtype == torch.int32 and block_table.shape[0] == b,
            f"{name}: PA_BSND needs an int32 block_table [B, ...]")
    require(isinstance(actual_seq_lengths_kv, torch.Tensor) and actual_seq_lengths_kv.dtype == torch.int32
            and tuple(actual_seq_lengths_kv.shape) == (b,),
            f"{name}: PA_BSND needs actual_seq_lengths_kv int32 [B]")
    valid = sparse_indices >= 0
    # "每行有效值均在前半部分，无效值均在后半部分": once invalid, invalid to the end of the row
    require(bool((valid[..., 1:] <= valid[..., :-1]).all()), f"{name}: valid indices must come first in each row")
    lengths = actual_seq_lengths_kv.long()
    require(bool(((sparse_indices.long() + 1) * sparse_block_size <= lengths[:, None, None, None])[valid].all()),
            f"{name}: indices must lie inside the batch's KV sequence")
    require(bool((lengths <= block_table.shape[1] * key_block_size).all()), f"{name}: block_table too narrow")
    return b, s1, n1


def _sparse_attend(query_full, keys_of, sparse_indices, lengths, sparse_mode, scale, b, s1, dv):
    """Shared sparse loop: keys_of(batch, positions) -> (K [L, Dk], V [L, Dv])."""
    out = torch.empty(b, s1, query_full.shape[2], dv, dtype=torch.float64)
    for i in range(b):
        for s in range(s1):
            idx = sparse_indices[i, s, 0]
            idx = idx[idx >= 0].long()
            k, v = keys_of(i, idx)
            visible = torch.ones(1, idx.numel(), dtype=torch.bool)
            if sparse_mode == 3:
                visible = visible & (idx <= int(lengths[i]) - s1 + s)[None]
            o, _ = _attend(query_full[i, s][None], k[None], v[None], visible, scale)
            out[i, s] = o[0]
    return out


class SparseFlashAttention:
    def __init__(self, owner) -> None:
        self.owner = owner

    def __call__(self, query, key, value, sparse_indices, scale_value, *, block_table=None,
                 actual_seq_lengths_query=None, actual_seq_lengths_kv=None, query_rope=None, key_rope=None,
                 sparse_block_size=1, layout_query="BSND", layout_kv="BSND", sparse_mode=3, pre_tokens=INT64_MAX,
                 next_tokens=INT64_MAX, attention_mode=0, return_softmax_lse=False, sinks=None):
        self.owner.record("npu_sparse_flash_attention")
        name = "npu_sparse_flash_attention"
        require(sinks is None or self.owner.chip == "950", f"{name}: sinks are not supported on A2/A3")
        require(not return_softmax_lse, f"{name}: return_softmax_lse is for training without PA_BSND only")
        require(actual_seq_lengths_query is None, "stand-in: actual_seq_lengths_query is not implemented")
        for n_, t in (("query", query), ("key", key), ("value", value), ("query_rope", query_rope),
                      ("key_rope", key_rope)):
            require(isinstance(t, torch.Tensor) and t.dtype == query.dtype
                    and t.dtype in (torch.float16, torch.bfloat16),
                    f"{name}: {n_} must be fp16/bf16 like query")
            require(t.is_contiguous(), f"{name}: {n_} must be contiguous (A2/A3: no non-contiguous key/value/key_rope)")
        heads = tuple(range(1, 129)) if self.owner.chip == "950" else MLA_HEADS_A2A3
        nb, bs = key.shape[0], key.shape[1]
        b, s1, n1 = _check_sparse_common(self.owner, name, query, block_table, actual_seq_lengths_kv, sparse_indices,
                                         layout_query, layout_kv, sparse_mode, pre_tokens, next_tokens, attention_mode,
                                         sparse_block_size, heads, bs)
        require(query.shape[3] == NOPE and tuple(query_rope.shape) == (b, s1, n1, ROPE),
                f"{name}: query D 512 and query_rope D 64")
        require(tuple(key.shape) == (nb, bs, 1, NOPE) and value.shape == key.shape
                and tuple(key_rope.shape) == (nb, bs, 1, ROPE), f"{name}: PA_BSND key/value [blocks, block_size, 1, "
                "512], key_rope [.., 64]")

        def keys_of(i, idx):
            pos = (idx[:, None] * sparse_block_size + torch.arange(sparse_block_size)).flatten()
            blocks, offs = _paged_positions(block_table, i, pos, bs)
            return torch.cat((key[blocks, offs, 0], key_rope[blocks, offs, 0]), -1), value[blocks, offs, 0]

        q_full = torch.cat((query, query_rope), -1)
        out = _sparse_attend(q_full, keys_of, sparse_indices, actual_seq_lengths_kv, sparse_mode, scale_value,
                             b, s1, NOPE)
        return out.to(query.dtype), torch.empty(0), torch.empty(0)


class KvQuantSparseFlashAttention:
    def __init__(self, owner) -> None:
        self.owner = owner

    def __call__(self, query, key, value, sparse_indices, scale_value, key_quant_mode, value_quant_mode, *,
                 key_dequant_scale=None, value_dequant_scale=None, block_table=None, actual_seq_lengths_query=None,
                 actual_seq_lengths_kv=None, sparse_block_size=1, layout_query="BSND", layout_kv="BSND",
                 sparse_mode=3, pre_tokens=INT64_MAX, next_tokens=INT64_MAX, attention_mode=0,
                 quant_scale_repo_mode=1, tile_size=128, rope_head_dim=64, key_dtype=None, value_dtype=None,
                 sinks=None):
        self.owner.record("npu_kv_quant_sparse_flash_attention")
        name = "npu_kv_quant_sparse_flash_attention"
        require(key_quant_mode == 2 and value_quant_mode == 2, f"{name}: key/value_quant_mode 2 (per_tile) only")
        require(key_dequant_scale is None and value_dequant_scale is None, f"{name}: *_dequant_scale are reserved")
        require(quant_scale_repo_mode == 1 and tile_size == 128 and rope_head_dim == 64,
                f"{name}: quant_scale_repo_mode 1, tile_size 128, rope_head_dim 64 only")
        require(key_dtype is None and value_dtype is None, "stand-in: key_dtype (hifloat8) is not implemented")
        require(actual_seq_lengths_query is None, "stand-in: actual_seq_lengths_query is not implemented")
        require(sinks is None or self.owner.chip == "950", f"{name}: sinks are not supported on A2/A3")
        allowed = (torch.int8, torch.float8_e4m3fn) if self.owner.chip == "950" else (torch.int8,)
        require(key.dtype in allowed and value.dtype == key.dtype,
                f"{name}: key/value dtype must be one of {allowed} on this chip, got {key.dtype}")
        require(key.dtype == torch.float8_e4m3fn, "stand-in: only float8_e4m3fn keys are implemented")
        require(query.dtype in (torch.float16, torch.bfloat16) and query.is_contiguous(),
                f"{name}: query bf16/fp16, contiguous")
        heads = (1, 2, 4, 8, 16, 32, 48, 64, 128) if self.owner.chip == "950" else MLA_HEADS_A2A3
        nb, bs = key.shape[0], key.shape[1]
        b, s1, n1 = _check_sparse_common(self.owner, name, query, block_table, actual_seq_lengths_kv, sparse_indices,
                                         layout_query, layout_kv, sparse_mode, pre_tokens, next_tokens, attention_mode,
                                         sparse_block_size, heads, bs, max_sparse_block=16)
        require(query.shape[3] == NOPE + ROPE, f"{name}: query D must be 576 (nope + rope)")
        require(tuple(key.shape) == (nb, bs, 1, 656) and value.shape == key.shape,
                f"{name}: key/value [block_num, block_size, 1, 656]")
        require(key.stride(-1) == 1 and key.stride(1) == 656 and key.stride(2) == 656,
                f"{name}: key rows contiguous (only axis 0 may be non-contiguous, PA_BSND on 950)")
        rows = key.view(torch.uint8)

        def keys_of(i, idx):
            blocks, offs = _paged_positions(block_table, i, idx, bs)
            r = rows[blocks, offs, 0]                                           # [L, 656]
            nope = r[:, :NOPE].contiguous().view(torch.float8_e4m3fn).double()
            rope = r[:, NOPE:NOPE + 2 * ROPE].contiguous().view(query.dtype).double()
            scales = r[:, NOPE + 2 * ROPE:].contiguous().view(torch.float32).double()   # [L, 4]
            latent = nope * scales.repeat_interleave(128, -1)
            return torch.cat((latent, rope), -1), latent

        out = _sparse_attend(query, keys_of, sparse_indices, actual_seq_lengths_kv, sparse_mode, scale_value,
                             b, s1, NOPE)
        return out.to(query.dtype)
