"""Custom ops of MLA decode: get_mla_metadata and flash_mla_with_kvcache.

Tensor-only form of `MlaMetadata`: `get_mla_metadata` returns `(Tensor[] tensors, Tensor[] num_splits)`
— the backend's scheduling tensors, and num_splits as a list of zero or one tensor (None when the
backend has none). The rest of an MlaMetadata — the backend that computed it and the configuration
— is static: the route fixes the backend when it traces (the op checks it when it runs) and passes
both to `flash_mla_with_kvcache` as `meta_*` arguments, which rebuilds the MlaMetadata inside.
The fake of get_mla_metadata runs the selected provider's registered fake
(`register_provider_fake`; e.g. the cpu native split plan, whose task count depends on the
lengths, gives it a data-dependent size), else the provider itself on fake tensors (the reference
computes its shapes from sizes only). `flash_mla_with_kvcache` writes `out` and `lse` (`Tensor(o!)`,
`Tensor(l!)`); the route allocates them when the caller passes None and returns them.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops.attention import decode as mla
from ..core.compiled import ROUTES
from ..core.dispatch import plan_for
from ..core.errors import ContractError, format_problem
from ..ops.attention.decode import MlaMetadata, MlaMetadataInputs
from .boundary import check_ran_on, define, fresh, frozen_new, op, provider_fake, require, selected


def _metadata_impl(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache, topk, backend):
    meta, num_splits = mla.get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q,
                                            is_fp8_kvcache, topk)
    check_ran_on(mla.GET_MLA_METADATA.name, "the backend computing it", (backend,), (meta.backend,))
    return fresh(list(meta.tensors), cache_seqlens), fresh([] if num_splits is None else [num_splits], cache_seqlens)


def _metadata_fake(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache, topk, backend):
    inputs = MlaMetadataInputs(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache, topk)
    provider = plan_for(mla.GET_MLA_METADATA, inputs).provider_for(inputs)
    fake = provider_fake(provider)
    try:
        tensors, num_splits = (fake or provider.fn)(inputs)
    except Exception as exc:
        raise ContractError(
            f"get_mla_metadata: provider {provider.backend}/{provider.name} cannot run on fake tensors, so "
            f"torch.compile cannot trace it ({type(exc).__name__}: {exc}). Fix: register the shapes of its "
            f"outputs with portable_kernels.torch_ops.register_provider_fake, or call get_mla_metadata outside "
            f"the compiled function and pass its result in.") from exc
    return list(tensors), ([] if num_splits is None else [num_splits])


define("get_mla_metadata(Tensor cache_seqlens, int num_q_tokens_per_head_k, int num_heads_k, int? num_heads_q, "
       "bool is_fp8_kvcache, int? topk, str backend) -> (Tensor[] tensors, Tensor[] num_splits)",
       _metadata_impl, _metadata_fake)


def get_mla_metadata(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int, num_heads_k: int,
                     num_heads_q: int | None = None, is_fp8_kvcache: bool = False,
                     topk: int | None = None) -> tuple[MlaMetadata, torch.Tensor | None]:
    backend = selected(mla.GET_MLA_METADATA.name, cache_seqlens.device)[0]
    tensors, splits = op("get_mla_metadata")(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q,
                                             is_fp8_kvcache, topk, backend)
    num_splits = splits[0] if len(splits) else None
    meta = frozen_new(MlaMetadata, backend=backend, batch_size=cache_seqlens.shape[0],
                      num_q_tokens_per_head_k=num_q_tokens_per_head_k, num_heads_k=num_heads_k, num_heads_q=num_heads_q,
                      is_fp8_kvcache=is_fp8_kvcache, topk=topk, tensors=tuple(tensors), num_splits=num_splits)
    return meta, num_splits


def _decode_impl(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_tensors, meta_num_splits,
                 meta_backend, meta_batch_size, meta_num_q_tokens_per_head_k, meta_num_heads_k, meta_num_heads_q,
                 meta_is_fp8_kvcache, meta_topk, pass_num_splits, softmax_scale, causal, is_fp8_kvcache, indices, out,
                 lse, attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                 extra_topk_length=None):
    meta = MlaMetadata(meta_backend, meta_batch_size, meta_num_q_tokens_per_head_k, meta_num_heads_k,
                       meta_num_heads_q, meta_is_fp8_kvcache, meta_topk, tuple(tile_scheduler_tensors),
                       meta_num_splits)
    mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, meta,
                               meta_num_splits if pass_num_splits else None, softmax_scale, causal, is_fp8_kvcache,
                               indices, attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length,
                               extra_topk_length, out=out, lse=lse)


def _decode_fake(*args):
    return None


define("flash_mla_with_kvcache(Tensor q, Tensor k_cache, Tensor? block_table, Tensor? cache_seqlens, int head_dim_v, "
       "Tensor[] tile_scheduler_tensors, Tensor? meta_num_splits, str meta_backend, SymInt meta_batch_size, "
       "int meta_num_q_tokens_per_head_k, int meta_num_heads_k, int? meta_num_heads_q, bool meta_is_fp8_kvcache, "
       "int? meta_topk, bool pass_num_splits, float? softmax_scale, bool causal, bool is_fp8_kvcache, "
       "Tensor? indices, Tensor(o!) out, Tensor(l!) lse, Tensor? attn_sink=None, Tensor? extra_k_cache=None, "
       "Tensor? extra_indices_in_kvcache=None, Tensor? topk_length=None, Tensor? extra_topk_length=None) -> ()",
       _decode_impl, _decode_fake)


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor | None,
                           cache_seqlens: torch.Tensor | None, head_dim_v: int, tile_scheduler_metadata: Any,
                           num_splits: torch.Tensor | None = None, softmax_scale: float | None = None,
                           causal: bool = False, is_fp8_kvcache: bool = False, indices: torch.Tensor | None = None,
                           attn_sink: torch.Tensor | None = None, extra_k_cache: torch.Tensor | None = None,
                           extra_indices_in_kvcache: torch.Tensor | None = None,
                           topk_length: torch.Tensor | None = None, extra_topk_length: torch.Tensor | None = None,
                           *, out: torch.Tensor | None = None,
                           lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    name = mla.FLASH_MLA_WITH_KVCACHE.name
    meta = tile_scheduler_metadata
    require(name, "tile_scheduler_metadata", meta, MlaMetadata,
            "the MlaMetadata returned by portable_kernels.get_mla_metadata",
            "call get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv, ...) from portable_kernels")
    require(name, "q", q, torch.Tensor, "a bf16 [b, s_q, h_q, d] tensor", "pass q as bf16 [b, s_q, h_q, 576]")
    if q.dim() != 4:
        raise ContractError(format_problem(name, "q", f"{q.dim()}-D", "a bf16 [b, s_q, h_q, d] tensor",
                                           "pass q as bf16 [b, s_q, h_q, 576] (or 512)"))
    b, s_q, h_q, _ = q.shape
    if out is None:
        out = torch.empty((b, s_q, h_q, mla.HEAD_DIM_V), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((b, h_q, s_q), dtype=mla.LSE_DTYPE, device=q.device)
    op("flash_mla_with_kvcache")(q, k_cache, block_table, cache_seqlens, head_dim_v, list(meta.tensors),
                                 meta.num_splits, meta.backend, meta.batch_size, meta.num_q_tokens_per_head_k,
                                 meta.num_heads_k, meta.num_heads_q, meta.is_fp8_kvcache, meta.topk,
                                 num_splits is not None, softmax_scale, causal, is_fp8_kvcache, indices, out, lse,
                                 attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length)
    return out, lse


ROUTES.update(get_mla_metadata=get_mla_metadata, flash_mla_with_kvcache=flash_mla_with_kvcache)
