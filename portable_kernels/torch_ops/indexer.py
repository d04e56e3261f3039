"""Custom ops of the lightning-indexer logits (fp8_mqa_logits, fp8_paged_mqa_logits). `q` crosses as
its FP8 tensor (DeepGEMM's `(q, None)` form is unwrapped by the route; FP4 queries are refused
there), `kv` as its (values, scales) pair. The logits keep DeepGEMM's strides (rows 1024-byte
aligned), in the fake as in the implementation. Schema, route and implementation come from the
public signatures (`declare.custom_op`)."""

from __future__ import annotations

from typing import Any

import torch

from ..ops.attention import indexer
from .declare import Crossing, custom_op


def _q_crossing(dims: int, op: str) -> Crossing:
    return Crossing((("Tensor", "q"),), lambda q: (indexer.unwrap_q(op, q, dims),), lambda q: q)


def _prefill_fake(q: torch.Tensor, kv_data: torch.Tensor, max_seqlen_k: int, logits_dtype: torch.dtype,
                  **_: Any) -> torch.Tensor:
    n = kv_data.shape[0]
    width, padded = (max_seqlen_k, -(-max_seqlen_k // indexer.PREFILL_BLOCK_KV) * indexer.PREFILL_BLOCK_KV) \
        if max_seqlen_k > 0 else (n, n + indexer.PREFILL_BLOCK_KV)
    return indexer.allocate_logits(q.shape[0], width, padded, logits_dtype, q.device)


def _paged_fake(q: torch.Tensor, max_context_len: int, logits_dtype: torch.dtype, **_: Any) -> torch.Tensor:
    padded = -(-max_context_len // indexer.PAGED_SPLIT_KV) * indexer.PAGED_SPLIT_KV
    return indexer.allocate_logits(q.shape[0] * q.shape[1], max_context_len, padded, logits_dtype, q.device)


custom_op(indexer.fp8_mqa_logits, pairs=("kv",), returns="Tensor logits", fake=_prefill_fake, fresh_outputs=False,
          crossings={"q": _q_crossing(3, indexer.MQA_LOGITS.name)})
custom_op(indexer.fp8_paged_mqa_logits, returns="Tensor logits", fake=_paged_fake, fresh_outputs=False,
          crossings={"q": _q_crossing(4, indexer.PAGED_MQA_LOGITS.name)})
