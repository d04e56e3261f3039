"""FlashMLA's decode and prefill calls (flash_mla_interface) over the semantic ops.

The scheduling metadata follows FlashMLA's current interface: get_mla_metadata() takes no
arguments (old-style arguments are accepted and ignored) and returns (FlashMLASchedMeta(), None);
the first decode that uses it records its configuration and the backend's own MlaMetadata in it,
and later decodes must match that configuration (a ContractError otherwise, where FlashMLA asserts).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from ..ops.attention import prefill as attention, decode as mla
from ..core.errors import ContractError, format_problem
from ..core.tensors import describe


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's scheduling metadata: filled by the first flash_mla_with_kvcache call that uses it."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    have_initialized: bool = False
    config: Optional[Config] = None
    #: here: the selected backend's MlaMetadata (opaque, as FlashMLA's scheduling tensor)
    tile_scheduler_metadata: Any = None
    num_splits: Optional[torch.Tensor] = None


def get_mla_metadata(*args: Any, **kwargs: Any) -> tuple[FlashMLASchedMeta, None]:
    """An empty FlashMLASchedMeta (filled on first use) and None; arguments are ignored, as in FlashMLA."""
    return FlashMLASchedMeta(), None


def _config(q: torch.Tensor, k_cache: torch.Tensor, causal: bool, is_fp8_kvcache: bool, indices: Any,
            extra_k_cache: Any, extra_indices: Any) -> FlashMLASchedMeta.Config:
    return FlashMLASchedMeta.Config(
        q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1], k_cache.shape[2], causal, is_fp8_kvcache,
        None if indices is None else indices.shape[-1], None if extra_k_cache is None else extra_k_cache.shape[1],
        None if extra_indices is None else extra_indices.shape[-1])


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: Optional[torch.Tensor],
                           cache_seqlens: Optional[torch.Tensor], head_dim_v: int,
                           tile_scheduler_metadata: FlashMLASchedMeta, num_splits: None = None,
                           softmax_scale: Optional[float] = None, causal: bool = False, is_fp8_kvcache: bool = False,
                           indices: Optional[torch.Tensor] = None, attn_sink: Optional[torch.Tensor] = None,
                           extra_k_cache: Optional[torch.Tensor] = None,
                           extra_indices_in_kvcache: Optional[torch.Tensor] = None,
                           topk_length: Optional[torch.Tensor] = None,
                           extra_topk_length: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [b, s_q, h_q, 512], lse fp32 [b, h_q, s_q]); see portable_kernels.flash_mla_with_kvcache."""
    op = "flash_mla_with_kvcache"
    sched = tile_scheduler_metadata
    if not isinstance(sched, FlashMLASchedMeta):
        raise ContractError(format_problem(op, "tile_scheduler_metadata", describe(sched),
                                           "the FlashMLASchedMeta of portable_kernels.flash_mla.get_mla_metadata()",
                                           "call get_mla_metadata() from this module"))
    if num_splits is not None:
        raise ContractError(format_problem(op, "num_splits", describe(num_splits), "None (FlashMLA's current "
                                           "interface)", "pass num_splits=None"))
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4:
        return mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, sched, None)  # raises
    config = _config(q, k_cache, causal, is_fp8_kvcache, indices, extra_k_cache, extra_indices_in_kvcache)
    if not sched.have_initialized:
        lengths = cache_seqlens if cache_seqlens is not None else torch.zeros(q.shape[0], dtype=torch.int32,
                                                                              device=q.device)
        h_k = k_cache.shape[2]
        meta, splits = mla.get_mla_metadata(lengths, q.shape[1] * q.shape[2] // max(h_k, 1), h_k, q.shape[2],
                                            is_fp8_kvcache, config.topk)
        sched.have_initialized, sched.config = True, config
        sched.tile_scheduler_metadata, sched.num_splits = meta, splits
    elif sched.config != config:
        changed = [f.name for f in dataclasses.fields(config) if getattr(config, f.name) != getattr(sched.config, f.name)]
        raise ContractError(format_problem(op, "tile_scheduler_metadata", f"initialized for another configuration "
                                           f"({', '.join(changed)} differ)", "the configuration of its first call",
                                           "use one FlashMLASchedMeta per configuration (get_mla_metadata())"))
    return mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, sched.tile_scheduler_metadata,
                                      sched.num_splits, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink,
                                      extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length)


def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
                         attn_sink: Optional[torch.Tensor] = None,
                         topk_length: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse prefill: (out, max_logits, lse); see portable_kernels.flash_mla_sparse_fwd."""
    return attention.flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_qo: torch.Tensor,
                           cu_seqlens_kv: torch.Tensor, max_seqlen_qo: int, max_seqlen_kv: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False, deterministic: bool = False,
                           is_varlen: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen attention, forward only: (out, lse); see portable_kernels.flash_attn_varlen_func."""
    return attention.flash_attn_varlen_func(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv,
                                            dropout_p, softmax_scale, causal, deterministic, is_varlen)


def flash_attn_varlen_qkvpacked_func(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, head_dim_qk: int,
                                     dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                     causal: bool = False, deterministic: bool = False,
                                     is_varlen: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen attention on packed [total, h, 2·d_qk + d_v] q | k | v."""
    return flash_attn_varlen_func(qkv[:, :, :head_dim_qk], qkv[:, :, head_dim_qk:2 * head_dim_qk],
                                  qkv[:, :, 2 * head_dim_qk:], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, deterministic, is_varlen)


def flash_attn_varlen_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, cu_seqlens_qo: torch.Tensor,
                                    cu_seqlens_kv: torch.Tensor, max_seqlen_qo: int, max_seqlen_kv: int,
                                    head_dim_qk: int, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                    causal: bool = False, deterministic: bool = False,
                                    is_varlen: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen attention with packed [total_kv, h_kv, d_qk + d_v] k | v."""
    return flash_attn_varlen_func(q, kv[:, :, :head_dim_qk], kv[:, :, head_dim_qk:], cu_seqlens_qo, cu_seqlens_kv,
                                  max_seqlen_qo, max_seqlen_kv, dropout_p, softmax_scale, causal, deterministic,
                                  is_varlen)
