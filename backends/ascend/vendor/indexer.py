"""Lightning-indexer providers of the ascend backend (docs/ascend.md, *Lightning indexer*).

CANN has no operator that returns the indexer logits: `npu_lightning_indexer` (bf16/fp16 q and k)
and `npu_quant_lightning_indexer` (int8 / float8_e4m3fn / hifloat8 q and k) fuse the logits with
the top-k and return int32 indices only. So:

- `mqa_logits` / `paged_mqa_logits` serve our logits contract from plain torch ops that torch_npu
  runs on the NPU (FP8 -> fp32, matmul, per-key scale, relu, one batched matmul over the heads).
  Cost: the fp32 scores [rows, H, keys] are materialized (4·H bytes per logit, bounded per chunk by
  `SCORE_CHUNK_BYTES`), against DeepGEMM's one fused pass; every key column of a row is computed,
  the invalid ones are not written.
- `lightning_indexer_topk` is the fused mapping, a separate function a model calls to get the
  indices directly: our paged inputs passed to `npu_quant_lightning_indexer` on the Ascend 950 with
  no conversion of the cache (the FP8 values and fp32 scales are strided views of
  `layouts.indexer_cache`'s bytes, which CANN's PA_BSND layout accepts: only axis 0 non-contiguous).

Nothing here has run on an NPU; the stand-in in tests/backends/ascend/ascend_stub implements the
documented semantics.
"""

from __future__ import annotations

from typing import Any

import torch

from portable_kernels.core.providers import Limit
from portable_kernels.layouts.indexer_cache import dequantize_fp4_rows, indexer_cache_views
from portable_kernels.ops.attention.indexer import MqaLogitsInputs, PagedMqaLogitsInputs, write_valid

#: upper bound on the fp32 scores one step materializes (rows · H · keys · 4 bytes)
SCORE_CHUNK_BYTES = 256 << 20

# -- npu_quant_lightning_indexer's documented limits (torch_npu master 517f2e7,
#    docs/zh/custom_APIs/torch_npu/torch_npu-npu_quant_lightning_indexer.md)
#: "参数说明", NOTE: "参数query中的D和参数key中的D值相等为128" (npu_lightning_indexer.md: also "约束说明")
FUSED_HEAD_DIM = Limit("d", min=128, max=128)
#: "参数说明", key: "block_size取值为16的整数倍，最大支持到1024"
FUSED_BLOCK = Limit("block_kv", min=16, max=1024, multiple_of=16)
#: "约束说明", Ascend 950PR/950DT: "query N1仅支持8、16、24、32、64"
FUSED_HEADS_950 = (8, 16, 24, 32, 64)
#: "参数说明", sparse_count: "支持[1, 2048]"
FUSED_TOPK = Limit("topk", min=1, max=2048)
#: "约束说明": "该接口要求W ⊙ Scale_Q的结果在float16的表示范围内"
FP16_MAX = 65504.0
#: "参数说明", sparse_mode: 3 = rightDownCausal (query t of S1 sees keys j < S2 - S1 + 1 + t)
SPARSE_MODE_RIGHT_DOWN_CAUSAL = 3
#: "参数说明", query_quant_mode / key_quant_mode: Per-Token-Head only, "仅支持传入0"
QUANT_MODE_PER_TOKEN_HEAD = 0

_E4M3_TABLES: dict[torch.device, torch.Tensor] = {}


def _e4m3_to_float(t: torch.Tensor, native_fp8: bool) -> torch.Tensor:
    """fp32 values of float8_e4m3fn data. Atlas A2/A3 have no FP8 datatype (docs/ascend.md, *Chips*),
    so there the bytes are decoded through a 256-entry table (a gather, exact on any device)."""
    if native_fp8:
        return t.float()
    table = _E4M3_TABLES.get(t.device)
    if table is None:
        table = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().to(t.device)
        _E4M3_TABLES[t.device] = table
    return table[t.contiguous().view(torch.uint8).long()]


def _rows_per_step(heads: int, keys: int) -> int:
    return max(1, SCORE_CHUNK_BYTES // max(1, heads * keys * 4))


def mqa_logits(call: MqaLogitsInputs, native_fp8: bool) -> None:
    """fp8_mqa_logits: scores = (q · v) · s per key in fp32, relu, then Σ_h weights[i, h] · scores as
    one batched matmul; the valid entries written into call.logits (row chunks)."""
    fp4 = call.q_scales is not None
    m, heads, d = call.q.shape
    if fp4:  # FP4 q and keys (DeepGEMM's SM100 form): widened exactly by torch ops, scales inside
        d *= 2
        keys = dequantize_fp4_rows(call.kv, call.kv_scales)         # [N, D]
        scales = torch.ones(keys.shape[0], device=keys.device)
    else:
        keys = _e4m3_to_float(call.kv, native_fp8)                  # [N, D]
        scales = call.kv_scales.float()                             # [N]
    step = _rows_per_step(heads, keys.shape[0])
    for lo in range(0, m, step):
        hi = min(m, lo + step)
        q = (dequantize_fp4_rows(call.q[lo:hi], call.q_scales[lo:hi]) if fp4 else
             _e4m3_to_float(call.q[lo:hi], native_fp8)).reshape((hi - lo) * heads, d)
        scores = torch.matmul(q, keys.t()).mul_(scales).relu_().view(hi - lo, heads, -1)
        full = torch.bmm(call.weights[lo:hi].float().unsqueeze(1), scores).squeeze(1)
        write_valid(call.logits[lo:hi], full, call.k_start[lo:hi], call.k_end[lo:hi], call.compressed)


def paged_mqa_logits(call: PagedMqaLogitsInputs, native_fp8: bool) -> None:
    """fp8_paged_mqa_logits: each sequence's blocks gathered through block_table (entries past its
    longest row replaced by block 0, never read into a valid entry), then the same math as
    `mqa_logits`. No host reads: the gathered width is the table's (or the logits') width."""
    fp4 = call.q_scales is not None
    batch, next_n, heads, d = call.q.shape
    values, scales = indexer_cache_views(call.kv_cache)             # [blocks, bkv, D], [blocks, bkv]
    if fp4:  # the FP4 cache widened once by torch ops (its exponent words are the scales' bytes)
        d *= 2
        values = dequantize_fp4_rows(values.view(torch.uint8), scales.view(torch.int32))
        scales = torch.ones(values.shape[:2], device=values.device)
    block_kv = values.shape[1]
    width = call.logits.shape[1]
    columns = min(call.block_table.shape[1], -(-width // block_kv))
    used = -(-call.context_lens.amax(dim=1) // block_kv)            # blocks in use per sequence
    in_use = torch.arange(columns, device=call.q.device)[None, :] < used[:, None]
    ids = torch.where(in_use, call.block_table[:, :columns], 0).long()
    length = min(columns * block_kv, width)
    step = max(1, _rows_per_step(heads * next_n, length))
    lens = call.context_lens.reshape(-1)
    for lo in range(0, batch, step):
        hi = min(batch, lo + step)
        gathered = values[ids[lo:hi]]
        k = (gathered if fp4 else _e4m3_to_float(gathered, native_fp8)).reshape(hi - lo, -1, d)[:, :length]
        s = scales[ids[lo:hi]].reshape(hi - lo, -1)[:, :length].float()
        q = (dequantize_fp4_rows(call.q[lo:hi], call.q_scales[lo:hi]) if fp4 else
             _e4m3_to_float(call.q[lo:hi], native_fp8)).reshape(hi - lo, next_n * heads, d)
        scores = torch.matmul(q, k.transpose(1, 2)).mul_(s[:, None, :]).relu_()
        scores = scores.view((hi - lo) * next_n, heads, length)
        rows = slice(lo * next_n, hi * next_n)
        full = torch.bmm(call.weights[rows].float().unsqueeze(1), scores).squeeze(1)
        ends = lens[rows]
        write_valid(call.logits[rows, :length], full, torch.zeros_like(ends), ends, False)


# -- the fused mapping: indices straight from CANN ----------------------------------------------------

def lightning_indexer_topk_reasons(chip: str, q: torch.Tensor, kv_cache: torch.Tensor, topk: int) -> list[str]:
    """Why `lightning_indexer_topk` cannot map this call on `chip` (empty when it can)."""
    reasons = []
    if chip != "950":
        reasons.append(f"npu_quant_lightning_indexer takes float8_e4m3fn q/k on the Ascend 950 only (Atlas A3: "
                       f"int8 only); chip {chip}: npu_lightning_indexer would need bf16 keys, and v·s per token does "
                       "not round-trip through bf16")
    _, _, heads, d = q.shape
    block_kv = kv_cache.shape[1]
    dims = {"d": d, "block_kv": block_kv, "topk": topk}
    reasons += [f"npu_quant_lightning_indexer: {r}" for r in
                (lim.reason(dims) for lim in (FUSED_HEAD_DIM, FUSED_BLOCK, FUSED_TOPK)) if r]
    if chip == "950" and heads not in FUSED_HEADS_950:
        reasons.append(f"npu_quant_lightning_indexer on the Ascend 950 takes {list(FUSED_HEADS_950)} query heads, "
                       f"got {heads}")
    return reasons


def lightning_indexer_topk(npu: Any, chip: str, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                           context_lens: torch.Tensor, block_table: torch.Tensor, topk: int) -> torch.Tensor:
    """Top-`topk` key positions of each paged query row, by `npu_quant_lightning_indexer` (Ascend 950).

    Arguments as `fp8_paged_mqa_logits` (q float8_e4m3fn [B, T, H, 128]; kv_cache uint8 [blocks,
    block_kv, 1, 132] of `layouts.indexer_cache`; weights fp32/bf16 [B·T, H]; context_lens int32
    [B, T]; block_table int32 [B, max_blocks]) plus topk in [1, 2048]. Returns int32 [B·T, topk]:
    positions j < context_lens[b, t] in descending logit order, -1 past the row's key count (the
    order and the -1 fill are those of op-plugin's test golden; the API page states neither).

    Conversion: query = q (BSND); key / key_dequant_scale = the cache's FP8 values [blocks,
    block_kv, 1, D] and fp32 scales [blocks, block_kv, 1] as strided views (no copy);
    weights = sign(w) in bf16 and query_dequant_scale = |w| in fp32, which is exact: CANN computes
    W ⊙ ReLU(Scale_Q · Scale_K ⊙ Q·K), and sign(w) · ReLU(|w| · x) = w · ReLU(x) (ours has q without
    a scale, its scale folded into w). actual_seq_lengths_key = context_lens[:, -1], sparse_mode 3
    (rightDownCausal), so context_lens must be DeepSeek's MTP pattern context_lens[b, t] =
    context_lens[b, -1] - (T - 1 - t) >= 0 (checked, one host read). CANN's internal precision is
    its own (op-plugin's golden rounds relu(Q·K) to fp16), so near-ties may pick other indices
    than an fp32 top-k of our logits.
    """
    reasons = lightning_indexer_topk_reasons(chip, q, kv_cache, topk)
    if reasons:
        raise ValueError("lightning_indexer_topk: " + "; ".join(reasons))
    batch, next_n, heads, _ = q.shape
    if tuple(weights.shape) != (batch * next_n, heads):
        raise ValueError(f"lightning_indexer_topk: weights {tuple(weights.shape)}, expected {(batch * next_n, heads)}")
    if tuple(context_lens.shape) != (batch, next_n) or context_lens.dtype != torch.int32:
        raise ValueError(f"lightning_indexer_topk: context_lens {context_lens.dtype} {tuple(context_lens.shape)}, "
                         f"expected int32 {(batch, next_n)}")
    last = context_lens[:, -1:]
    causal = last - (next_n - 1 - torch.arange(next_n, device=context_lens.device, dtype=torch.int32))
    if not bool(((context_lens == causal) & (causal >= 0)).all()):
        raise ValueError("lightning_indexer_topk: context_lens must be the rightDownCausal pattern "
                         "context_lens[b, t] = context_lens[b, -1] - (next_n - 1 - t) >= 0 (sparse_mode 3); "
                         "other per-row lengths have no CANN form")
    w = weights.float().view(batch, next_n, heads)
    if bool((w.abs() > FP16_MAX).any()):
        raise ValueError(f"lightning_indexer_topk: |weights| > {FP16_MAX} (CANN requires W ⊙ Scale_Q in fp16 range)")
    values, scales = indexer_cache_views(kv_cache)
    out = npu.npu_quant_lightning_indexer(
        q, values.unsqueeze(2), torch.sign(w).to(torch.bfloat16), w.abs(), scales.unsqueeze(-1),
        QUANT_MODE_PER_TOKEN_HEAD, QUANT_MODE_PER_TOKEN_HEAD,
        actual_seq_lengths_query=torch.full((batch,), next_n, dtype=torch.int32, device=q.device),
        actual_seq_lengths_key=last.reshape(batch).contiguous(), block_table=block_table,
        layout_query="BSND", layout_key="PA_BSND", sparse_count=topk, sparse_mode=SPARSE_MODE_RIGHT_DOWN_CAUSAL)
    return out.reshape(batch * next_n, topk)
