"""Delegation to FlashMLA (`flash_mla`) when it is importable.

FlashMLA's current interface (flash_mla/flash_mla_interface.py): `get_mla_metadata()` returns an
empty FlashMLASchedMeta that the first decode call fills (our own schedule does not transfer),
`flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, sched_meta,
num_splits=None, softmax_scale, causal, is_fp8_kvcache, indices)` returns new (out, lse). So a
call here builds a fresh FlashMLASchedMeta (FlashMLA schedules inside the call) and copies the
results into the contract's out and lse buffers. FlashMLA's documented limits: head_dim_v 512,
sparse decode only with the FP8 cache and causal=False; its kernels use 64-token pages.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from portable_kernels.layouts.constants import KV_PAGE_BLOCK_SIZE

from ._probe import missing_reason, module

PACKAGE = "flash_mla"


@attrs.frozen
class FlashMlaCall:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self, out: torch.Tensor, lse: torch.Tensor, library: Any = None) -> None:
        lib = library or module(PACKAGE)
        sched, _ = lib.get_mla_metadata()
        o, s = lib.flash_mla_with_kvcache(*self.args[:5], sched, None, **self.kwargs)
        out.copy_(o)
        lse.copy_(s)


def unavailable_reason() -> str | None:
    return missing_reason(PACKAGE)


def reasons(k_cache: torch.Tensor, h_kv: int) -> list[str]:
    out = []
    if k_cache.shape[1] != KV_PAGE_BLOCK_SIZE:
        out.append(f"FlashMLA's kernels use {KV_PAGE_BLOCK_SIZE}-token pages, this cache has {k_cache.shape[1]}")
    if h_kv != 1:
        out.append(f"MLA has one KV head; h_kv = {h_kv}")
    return out


def decode_call(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, is_fp8_kvcache,
                indices) -> FlashMlaCall:
    return FlashMlaCall((q, k_cache, block_table, cache_seqlens, head_dim_v),
                        {"softmax_scale": softmax_scale, "causal": causal, "is_fp8_kvcache": is_fp8_kvcache,
                         "indices": indices})
