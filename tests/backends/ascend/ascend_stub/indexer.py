"""Stand-in for `npu_quant_lightning_indexer` (torch_npu master 517f2e7,
docs/zh/custom_APIs/torch_npu/torch_npu-npu_quant_lightning_indexer.md), PageAttention form.

Math, from the API page's formula: per batch b and query token s,
    score[j] = Σ_g W[g] · ReLU(Scale_Q[g] · Scale_K[j] · (Q[g] · K[j]))
over keys j of the batch's sequence (read through block_table), then the top sparse_count j.
What the page does not state is taken from op-plugin's test golden
(test/test_custom_ops/test_npu_quant_lightning_indexer.py): sparse_mode 3 lets query s of act_s1
see keys j < act_s2 - act_s1 + 1 + s; indices are in descending score order (stable, ties to the
smaller j); slots past a row's visible keys and rows past act_s1 are -1. The scores are computed in
fp64 (the golden's fp16 rounding of ReLU(Q·K) is the kernel's business, not the documented math).
"""

from __future__ import annotations

import torch

from ._common import require

HEAD_DIM = 128
HEADS_950 = (8, 16, 24, 32, 64)
MAX_SPARSE_COUNT = 2048
MAX_BLOCK_SIZE = 1024
FP16_MAX = 65504.0
INT64_MAX = 2**63 - 1


def _only_axis0_strided(t: torch.Tensor) -> bool:
    """Contiguous except for axis 0 (the page: "在layout_key为PA_BSND时支持0轴非连续")."""
    return t[0].is_contiguous() if t.shape[0] else True


class QuantLightningIndexer:
    def __init__(self, owner) -> None:
        self.owner = owner

    def __call__(self, query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode=0,
                 key_quant_mode=0, *, actual_seq_lengths_query=None, actual_seq_lengths_key=None, block_table=None,
                 layout_query="BSND", layout_key="BSND", sparse_count=2048, sparse_mode=3, pre_tokens=INT64_MAX,
                 next_tokens=INT64_MAX, query_dtype=None, key_dtype=None):
        self.owner.record("npu_quant_lightning_indexer")
        op = "npu_quant_lightning_indexer"
        chip = self.owner.chip
        require(query_quant_mode == 0 and key_quant_mode == 0, f"{op}: query/key_quant_mode only 0 (Per-Token-Head)")
        require(pre_tokens == INT64_MAX and next_tokens == INT64_MAX, f"{op}: pre/next_tokens only the default 2^63-1")
        require(query_dtype is None and key_dtype is None, "stand-in: query_dtype / key_dtype are not implemented")
        require(layout_query == "BSND" and layout_key == "PA_BSND",
                "stand-in: only layout_query BSND with layout_key PA_BSND is implemented")
        require(sparse_mode in (0, 3), f"{op}: sparse_mode 0 or 3")
        require(1 <= sparse_count <= MAX_SPARSE_COUNT, f"{op}: sparse_count in [1, 2048]")
        # dtypes per chip ("约束说明")
        if chip == "950":
            require(query.dtype in (torch.float8_e4m3fn, torch.int8) and key.dtype == query.dtype,
                    f"{op} (Ascend 950): query/key float8_e4m3fn, hifloat8 or int8, the same dtype")
            combos = {torch.float8_e4m3fn: ((torch.bfloat16, torch.float32, torch.float32),
                                            (torch.float16, torch.float16, torch.float16)),
                      torch.int8: ((torch.float16, torch.float16, torch.float16),)}[query.dtype]
        else:  # the constraints name Atlas A3 only; the stand-in holds A2 to the same rule
            require(query.dtype == torch.int8 and key.dtype == torch.int8, f"{op} (Atlas A2/A3): query/key int8")
            combos = ((torch.float16, torch.float16, torch.float16),)
        given = (weights.dtype, query_dequant_scale.dtype, key_dequant_scale.dtype)
        require(given in combos, f"{op}: weights / query_dequant_scale / key_dequant_scale dtypes must be one of "
                f"{combos} for {query.dtype} on this chip, got {given}")
        # shapes and contiguity ("参数说明")
        require(query.dim() == 4 and query.is_contiguous(), f"{op}: query BSND [B, S1, N1, D], contiguous")
        b, s1, n1, d = query.shape
        require(d == HEAD_DIM, f"{op}: D must be 128")
        require(1 <= n1 <= 64, f"{op}: N1 in [1, 64]")
        if chip == "950":
            require(n1 in HEADS_950, f"{op} (Ascend 950): N1 only {HEADS_950}")
        require(key.dim() == 4 and key.shape[2] == 1 and key.shape[3] == d,
                f"{op}: key PA_BSND [block_count, block_size, N2 = 1, D]")
        blocks, block_size = key.shape[:2]
        require(block_size % 16 == 0 and 16 <= block_size <= MAX_BLOCK_SIZE,
                f"{op}: block_size a multiple of 16, at most 1024")
        require(_only_axis0_strided(key), f"{op}: key may be non-contiguous on axis 0 only")
        require(tuple(key_dequant_scale.shape) == (blocks, block_size, 1) and _only_axis0_strided(key_dequant_scale),
                f"{op}: key_dequant_scale [block_count, block_size, N2], non-contiguous on axis 0 only")
        for name, t in (("weights", weights), ("query_dequant_scale", query_dequant_scale)):
            require(tuple(t.shape) == (b, s1, n1) and t.is_contiguous(), f"{op}: {name} [B, S1, N1], contiguous")
        require(bool(((weights.double() * query_dequant_scale.double()).abs() <= FP16_MAX).all()),
                f"{op}: W ⊙ Scale_Q must lie in the float16 range")
        for name, t in (("actual_seq_lengths_query", actual_seq_lengths_query),
                        ("actual_seq_lengths_key", actual_seq_lengths_key)):
            require(t is not None and t.dtype == torch.int32 and tuple(t.shape) == (b,),
                    f"{op}: {name} int32 [B] (actual_seq_lengths_key is required for PA_BSND)")
        act_q, act_k = actual_seq_lengths_query.tolist(), actual_seq_lengths_key.tolist()
        require(all(0 <= n <= s1 for n in act_q), f"{op}: actual_seq_lengths_query in [0, S1]")
        require(all(n >= 0 for n in act_k), f"{op}: actual_seq_lengths_key >= 0")
        require(block_table is not None and block_table.dtype == torch.int32 and block_table.dim() == 2
                and block_table.shape[0] == b, f"{op}: block_table int32 [B, maxBlockNumPerSeq]")
        need = max([-(-n // block_size) for n in act_k] + [0])
        require(block_table.shape[1] >= need, f"{op}: block_table's second dim must be >= maxBlockNumPerSeq")
        return self._compute(query, key, weights, query_dequant_scale, key_dequant_scale, act_q, act_k, block_table,
                             sparse_count, sparse_mode)

    @staticmethod
    def _compute(query, key, weights, sq, sk, act_q, act_k, block_table, sparse_count, sparse_mode):
        b, s1, n1, d = query.shape
        block_size = key.shape[1]
        out = torch.full((b, s1, 1, sparse_count), -1, dtype=torch.int32)
        for batch in range(b):
            nq, nk = act_q[batch], act_k[batch]
            if nq == 0 or nk == 0:
                continue
            pos = torch.arange(nk)
            blocks = block_table[batch, pos // block_size].long()
            require(bool(((blocks >= 0) & (blocks < key.shape[0])).all()), "npu_quant_lightning_indexer: block_table "
                    "entry out of range for a block in use")
            k = key[blocks, pos % block_size, 0].double()                          # [nk, D]
            scale_k = sk[blocks, pos % block_size, 0].double()                     # [nk]
            q = query[batch, :nq].double()                                         # [nq, N1, D]
            dots = torch.einsum("sgd,jd->sgj", q, k)
            scaled = sq[batch, :nq].double()[..., None] * scale_k[None, None, :] * dots
            score = (weights[batch, :nq].double()[..., None] * scaled.relu()).sum(1)  # [nq, nk]
            visible = torch.full((nq,), nk) if sparse_mode == 0 else nk - nq + 1 + torch.arange(nq)
            cols = torch.arange(nk)[None, :]
            score = score.masked_fill(cols >= visible[:, None], float("-inf"))
            order = torch.sort(score, dim=1, descending=True, stable=True).indices
            order = torch.where(torch.arange(nk)[None, :] < visible.clamp(min=0)[:, None], order, -1)
            count = min(sparse_count, nk)
            out[batch, :nq, 0, :count] = order[:, :count].to(torch.int32)
        return out
