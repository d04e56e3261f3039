"""Paged KV caches written straight in a backend's KV-cache Format: allocate the pages, write tokens.

`allocate_kv_cache` returns zeroed pages as a `PreparedKVCache` in the selected backend's KV-cache
Format (zero bytes are the same rows in every order); `write_kv_cache` quantizes new tokens' 576 bf16
channels with FlashMLA's `quantize_k_cache` rule and stores the rows in the cache's Format (its 656
bytes in the cache's order, or on Atlas A2/A3 their exact bf16 values), so a model's decode converts
nothing. A bf16 cache (no Format) is written as is.
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.checks import check_tensor
from ...core.errors import ContractError, format_problem
from ...core.kv_cache import PreparedKVCache, cache_bytes, cache_format_for
from ...core.prepare import _target_device, backend_params
from ...core.registry import select_backend
from ...core.tensors import describe
from ...layouts.constants import KV_HEAD_DIM, KV_LATENT_DIM, KV_PAGE_BLOCK_SIZE
from ...layouts.kv_cache import pack_fp8_kv_cache

__all__ = ["allocate_kv_cache", "write_kv_cache", "PreparedKVCache"]

_OP = "flash_mla_with_kvcache"


def allocate_kv_cache(num_blocks: int, block_size: int = KV_PAGE_BLOCK_SIZE, *, device: str | torch.device | None = None,
                      backend: str | None = None, options: dict[str, Any] | None = None) -> PreparedKVCache:
    """Zeroed FP8 pages in the KV-cache Format of the backend flash_mla_with_kvcache would run on
    (`backend`/`options` as for prepare_inputs, else use_backend's or the device's): uint8
    [num_blocks, block_size, 1, 656], or the Format's own rows (Atlas A2/A3: the exact bf16 values,
    [..., 576]). Example: allocate_kv_cache(1024, device="npu") -> rows in CANN's order on a 950."""
    for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "num_blocks" else 1):
            raise ContractError(format_problem("allocate_kv_cache", name, describe(value), "a non-negative int",
                                               "pass the number of pages and tokens per page (64 for FlashMLA)"))
    dev = _target_device(device) or torch.device("cpu")
    selection = select_backend(_OP, dev, {}, requested=backend, options=options)
    fmt = cache_format_for(selection.backend, selection.options)
    data = fmt.zeros(num_blocks, block_size, dev)
    return PreparedKVCache(data, fmt, selection.backend.name, backend_params(selection.backend,
                                                                             dict(selection.options)))


def write_kv_cache(k_cache: Any, blocks: torch.Tensor, offsets: torch.Tensor, kv: torch.Tensor) -> None:
    """Write tokens into a paged cache, in place: kv bf16 [T, 576] (512 latent + 64 RoPE) at slots
    (blocks[t], offsets[t]), blocks/offsets int [T].

    k_cache: a PreparedKVCache (its rows in its Format's order), a raw FP8 cache uint8 / float8_e4m3fn
    [num_blocks, block_size, 1, 656] (FlashMLA's order), or a bf16 cache [num_blocks, block_size, 1, 576].
    FP8 rows are FlashMLA's quantize_k_cache bytes (per 128 latent values sf = 2^ceil(log2(max(amax/448,
    1e-4)))), then stored in the cache's Format (`fmt.encode`: moved into its order, or on Atlas A2/A3
    dequantized to its exact bf16 values) — exactly what converting a FlashMLA cache gives.
    """
    op = "write_kv_cache"
    data, fmt = cache_bytes(k_cache)
    if not isinstance(data, torch.Tensor) or data.dim() != 4 or data.shape[2] != 1:
        raise ContractError(format_problem(op, "k_cache", describe(k_cache), "a paged cache [num_blocks, block_size, "
                                           "1, 656] uint8 or [..., 576] bf16, or a PreparedKVCache",
                                           "allocate it with allocate_kv_cache"))
    check_tensor(op, "kv", kv, (torch.bfloat16,), (None, KV_HEAD_DIM), data.device,
                 "pass the new tokens' 576 channels as bf16 [T, 576]")
    for name, value in (("blocks", blocks), ("offsets", offsets)):
        if not isinstance(value, torch.Tensor) or value.dtype not in (torch.int32, torch.int64) \
                or tuple(value.shape) != (kv.shape[0],):
            raise ContractError(format_problem(op, name, describe(value), f"int32/int64 [{kv.shape[0]}] like kv",
                                               "pass one page index and one in-page offset per token"))
    if fmt is not None and fmt.paged:
        raise ContractError(format_problem(op, "k_cache", f"a {fmt.name} cache (d = {fmt.head_dim})",
                                           "a V3.2 cache (576 channels per token)",
                                           "write MODEL1 pages with flash_mla.quantize_k_cache(..., "
                                           "FP8KVCacheLayout.MODEL1_FP8Sparse) or layouts.pack_model1_kv_cache"))
    if fmt is None:
        if data.dtype != torch.bfloat16 or data.shape[3] != KV_HEAD_DIM:
            raise ContractError(format_problem(op, "k_cache", describe(data), "bf16 [..., 1, 576] or the FP8 cache",
                                               "allocate the cache with allocate_kv_cache"))
        data[blocks.long(), offsets.long(), 0] = kv
        return
    rows = pack_fp8_kv_cache(kv[:, :KV_LATENT_DIM], kv[:, KV_LATENT_DIM:], scale_rule="flash_mla")
    data[blocks.long(), offsets.long(), 0] = fmt.encode(rows)
