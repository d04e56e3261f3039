"""FlashMLA's sparse-decode extensions, composed around the registry's decode (no provider change):
`topk_length` (only the leftmost indices count), a second FP8 cache (`extra_k_cache` with
`extra_indices_in_kvcache`, one softmax over both caches) and `attn_sink` (out scaled by
exp(lse) / (exp(lse) + exp(sink)), lse unchanged).

How: topk_length masks the indices past it to -1 (a device op); with an extra cache, the tokens
both index sets point at are gathered into one small cache (block size 1, [b·s_q·(topk +
extra_topk)] tokens — the bytes the sparse kernel reads anyway) and ONE sparse decode runs over it,
so out is rounded once (merging two rounded partial outputs by their lse would not meet FlashMLA's
elementwise tolerance); the sink is one multiply in fp32. Gathered indices are clamped into the
cache, so a bad index never reads out of bounds (on CPU it is refused before, as every decode does).
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.checks import check_tensor
from ...core.errors import ContractError, format_problem
from ...core.contract import checks_values
from ...core.kv_cache import PreparedKVCache, cache_bytes, convert_cache_in_call
from .decode import (FLASH_MLA_WITH_KVCACHE, FP8_KV_HEADS, INDEX_DTYPE, INVALID_INDEX, SINK_DTYPE, _check_cache,
                  _check_indices_values, _check_metadata, _decode, get_mla_metadata)
from ...core.tensors import describe
from ...layouts.kv_cache import KVCacheFormat
from ...layouts.kv_cache_model1 import FLASHMLA_MODEL1_FP8_KV, model1_token_rows


def limit_topk(indices: torch.Tensor, topk_length: torch.Tensor | None) -> torch.Tensor:
    """indices [b, s_q, topk] with every slot at or past topk_length[b] set to -1 (None: unchanged)."""
    if topk_length is None:
        return indices
    keep = torch.arange(indices.shape[-1], device=indices.device) < topk_length.view(-1, 1, 1)
    return torch.where(keep, indices, INVALID_INDEX)


def joint_cache(k_cache: torch.Tensor, indices: torch.Tensor, extra_k_cache: torch.Tensor,
                extra_indices: torch.Tensor, fmt: KVCacheFormat | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens of both index sets as one cache uint8 [b·s_q·T, 1, 1, width] (T = topk + extra_topk)
    and int32 indices [b, s_q, T] into it (-1 kept where either set had -1). MODEL1 pages (`fmt`
    FLASHMLA_MODEL1_FP8_KV): a page of one token is its 576 value bytes then its 8 scale bytes."""
    parts = []
    for cache, idx in ((k_cache, indices), (extra_k_cache, extra_indices)):
        block_size = cache.shape[1]
        slots = idx.long().clamp(0, cache.shape[0] * block_size - 1)     # memory-safe for any value
        if fmt is FLASHMLA_MODEL1_FP8_KV:
            parts.append(model1_token_rows(cache, slots // block_size, slots % block_size).unsqueeze(-2))
        else:
            parts.append(cache[slots // block_size, slots % block_size])    # [b, s_q, topk, 1, 656]
    tokens = torch.cat(parts, dim=2)
    b, s_q, total = tokens.shape[:3]
    valid = torch.cat((indices, extra_indices), dim=-1) != INVALID_INDEX
    joint = torch.arange(b * s_q * total, device=indices.device, dtype=INDEX_DTYPE).view(b, s_q, total)
    return tokens.reshape(b * s_q * total, 1, 1, tokens.shape[-1]), torch.where(valid, joint, INVALID_INDEX)


def apply_sink(out: torch.Tensor, lse: torch.Tensor, attn_sink: torch.Tensor) -> None:
    """out *= exp(lse) / (exp(lse) + exp(attn_sink[h])) = 1 / (1 + exp(sink - lse)), in place."""
    factor = torch.sigmoid(lse - attn_sink.view(1, -1, 1))                                # [b, h_q, s_q]
    factor = factor.masked_fill(torch.isposinf(lse), 0.0)   # no key: out is 0 whatever the sink
    out.copy_(out.float() * factor.transpose(1, 2).unsqueeze(-1))


def _check_lengths(op: str, arg: str, lengths: Any, b: int, topk: int, device: torch.device) -> None:
    if lengths is None:
        return
    check_tensor(op, arg, lengths, (INDEX_DTYPE,), (b,), device, f"pass {arg} as int32 [b] (0..topk per sequence)")
    if lengths.device.type == "cpu" and bool(((lengths < 0) | (lengths > topk)).any()):
        raise ContractError(format_problem(op, arg, f"with values in [{int(lengths.min())}, {int(lengths.max())}]",
                                           f"values in [0, topk = {topk}]", "clamp the lengths to the indices' width"))


def sparse_decode_with_extras(q: torch.Tensor, k_cache: Any, head_dim_v: Any, meta: Any, num_splits: Any,
                              softmax_scale: Any, is_fp8_kvcache: Any, indices: Any, attn_sink: Any,
                              extra_k_cache: Any, extra_indices: Any, topk_length: Any, extra_topk_length: Any,
                              block_table: Any, cache_seqlens: Any, causal: Any, out: Any,
                              lse: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_mla_with_kvcache with indices and at least one of FlashMLA's sparse extensions."""
    op = FLASH_MLA_WITH_KVCACHE.name
    b, s_q, h_q, _ = q.shape
    check_tensor(op, "indices", indices, (INDEX_DTYPE,), (b, s_q, None), q.device,
                 "pass absolute cache slots block·block_size + offset, -1 for none")
    _check_lengths(op, "topk_length", topk_length, b, indices.shape[-1], q.device)
    if (extra_k_cache is None) != (extra_indices is None):
        missing = "extra_indices_in_kvcache" if extra_indices is None else "extra_k_cache"
        raise ContractError(format_problem(op, missing, "None", "given together with its partner",
                                           "pass extra_k_cache and extra_indices_in_kvcache together, or neither"))
    if extra_indices is not None:
        check_tensor(op, "extra_indices_in_kvcache", extra_indices, (INDEX_DTYPE,), (b, s_q, None), q.device,
                     "pass slots of extra_k_cache as int32 [b, s_q, extra_topk], -1 for none")
        _check_lengths(op, "extra_topk_length", extra_topk_length, b, extra_indices.shape[-1], q.device)
    elif extra_topk_length is not None:
        raise ContractError(format_problem(op, "extra_topk_length", describe(extra_topk_length),
                                           "None without extra_indices_in_kvcache", "drop it or pass the extra cache"))
    if attn_sink is not None:
        check_tensor(op, "attn_sink", attn_sink, (SINK_DTYPE,), (h_q,), q.device,
                     "pass one fp32 sink logit per query head, [h_q]")
    indices = limit_topk(indices, topk_length)
    if extra_indices is None:
        out, lse = _decode(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, num_splits, softmax_scale, causal,
                           is_fp8_kvcache, indices, out, lse)
    else:
        # the caller's metadata is for the first index set: check it as the plain call would
        _check_metadata(op, meta, num_splits, b, s_q, h_q, FP8_KV_HEADS, bool(is_fp8_kvcache), indices.shape[-1])
        if not is_fp8_kvcache:  # raises the plain call's error (sparse decode needs the FP8 cache)
            _decode(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, num_splits, softmax_scale, causal,
                    is_fp8_kvcache, indices, out, lse)
        prepared = k_cache if isinstance(k_cache, PreparedKVCache) else None
        k_cache, fmt = cache_bytes(k_cache)
        extra_tag = getattr(extra_k_cache, "backend", "cpu")
        extra_k_cache, extra_fmt = cache_bytes(extra_k_cache)
        _check_cache(op, q, k_cache, True, cache_format=fmt)
        _check_cache(op, q, extra_k_cache, True, "extra_k_cache", extra_fmt)
        if extra_fmt is not fmt:  # both caches' rows go into one joint cache: one order
            extra_k_cache = convert_cache_in_call(op, "extra_k_cache", extra_k_cache, extra_fmt, fmt, extra_tag)
        for cache, idx in ((k_cache, indices), (extra_k_cache, extra_indices)):
            if checks_values(idx):
                _check_indices_values(op, idx, cache)
        cache, joint = joint_cache(k_cache, indices, extra_k_cache, limit_topk(extra_indices, extra_topk_length),
                                   fmt)
        if prepared is not None:  # the joint rows keep the cache's order and backend
            cache = PreparedKVCache(cache, fmt, prepared.backend, prepared.params)
        lengths = torch.zeros(b, dtype=INDEX_DTYPE, device=q.device)  # sparse metadata reads only the batch size
        joint_meta, _ = get_mla_metadata(lengths, s_q * h_q // FP8_KV_HEADS, FP8_KV_HEADS, h_q, True, joint.shape[-1])
        out, lse = _decode(q, cache, None, None, head_dim_v, joint_meta, None, softmax_scale, False, True, joint, out,
                           lse)
    if attn_sink is not None:
        apply_sink(out, lse, attn_sink)
    return out, lse
