"""DeepGEMM's lightning-indexer kernels with its signatures: fp8_fp4_mqa_logits and
fp8_fp4_paged_mqa_logits (q as DeepGEMM's (values, scales-or-None) pair, logits_dtype), their
legacy forms fp8_mqa_logits / fp8_paged_mqa_logits (q a tensor, fp32 logits), and
get_paged_mqa_logits_metadata. Each calls the portable op of the same contract
(portable_kernels.ops.attention.indexer). FP4 q (int8 packed E2M1, int32 packed UE8M0 scales per
32 channels) with FP4 keys or the FP4 paged cache are served as DeepGEMM's SM100 form. Differs from
DeepGEMM: head counts and dims beyond DeepGEMM's per-arch lists are
accepted (the contract has no such limit, providers decline what they cannot run); clean_logits
with 2-D context lens is provided (DeepGEMM asserts it off); get_paged_mqa_logits_metadata returns
this library's even split of the key blocks, which DeepGEMM's kernels would not read.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops.attention import indexer

__all__ = ["fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "fp8_mqa_logits", "fp8_paged_mqa_logits",
           "get_paged_mqa_logits_metadata"]

get_paged_mqa_logits_metadata = indexer.get_paged_mqa_logits_metadata


def fp8_fp4_mqa_logits(q: tuple[torch.Tensor, Any], kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                       cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor, clean_logits: bool = True,
                       max_seqlen_k: int = 0, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """DeepGEMM `fp8_fp4_mqa_logits`: logits [M, N] (or [M, max_seqlen_k]) of q (fp8 [M, H, D], None) and
    kv (fp8 [N, D], fp32 [N]), or of FP4 q (int8 [M, H, D/2], int32 [M, H]) and kv (int8 [N, D/2], int32 [N])."""
    return indexer.fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k,
                                  logits_dtype)


def fp8_fp4_paged_mqa_logits(q: tuple[torch.Tensor, Any], kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_table: torch.Tensor, schedule_meta: torch.Tensor,
                             max_context_len: int, clean_logits: bool = False,
                             logits_dtype: torch.dtype = torch.float32,
                             indices: torch.Tensor | None = None) -> torch.Tensor:
    """DeepGEMM `fp8_fp4_paged_mqa_logits`: logits [B·next_n, max_context_len]."""
    return indexer.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                                        max_context_len, clean_logits, logits_dtype, indices)


def fp8_mqa_logits(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                   cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor, clean_logits: bool = True,
                   max_seqlen_k: int = 0) -> torch.Tensor:
    """DeepGEMM's legacy `fp8_mqa_logits` (q a tensor, fp32 logits)."""
    return indexer.fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k)


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_table: torch.Tensor, schedule_meta: torch.Tensor, max_context_len: int,
                         clean_logits: bool = False, indices: torch.Tensor | None = None) -> torch.Tensor:
    """DeepGEMM's legacy `fp8_paged_mqa_logits` (q a tensor, fp32 logits)."""
    return indexer.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                                        max_context_len, clean_logits, torch.float32, indices)
