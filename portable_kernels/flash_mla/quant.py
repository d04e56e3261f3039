"""FlashMLA's FP8 KV cache (V3.2 layout, 656 bytes per token) written and read with FlashMLA's rule.

`quantize_k_cache(k_cache [num_blocks, block_size, 1, 576] bf16)` -> float8_e4m3fn
[num_blocks, block_size, 1, 656] holding FlashMLA's bytes: per tile of 128 latent values
sf = 2^ceil(log2(max(amax / 448, 1e-4))), NaN passed through (layouts.pack_fp8_kv_cache with
scale_rule="flash_mla"). The MODEL1 layout (d = 512, 448 + 64, UE8M0 scales per 64) is not provided.
"""

from __future__ import annotations

import enum

import torch

from ..core.errors import ContractError, format_problem
from ..layouts import KV_FP8_BYTES_PER_TOKEN, KV_HEAD_DIM, KV_LATENT_DIM, dequantize_fp8_kv_cache, pack_fp8_kv_cache
from ..core.tensors import describe


class FP8KVCacheLayout(enum.Enum):
    V32_FP8Sparse = 1
    MODEL1_FP8Sparse = 2


def _layout(op: str, kvcache_layout: FP8KVCacheLayout) -> None:
    if kvcache_layout is not FP8KVCacheLayout.V32_FP8Sparse:
        raise ContractError(format_problem(op, "kvcache_layout", repr(kvcache_layout), "FP8KVCacheLayout.V32_FP8Sparse",
                                           "the MODEL1 layout (d = 512) is not provided; use the V3.2 layout"))


def quantize_k_cache(input_k_cache: torch.Tensor,
                     kvcache_layout: FP8KVCacheLayout = FP8KVCacheLayout.V32_FP8Sparse) -> torch.Tensor:
    """bf16 [num_blocks, block_size, 1, 576] -> float8_e4m3fn [num_blocks, block_size, 1, 656] (FlashMLA's bytes)."""
    op = "quantize_k_cache"
    _layout(op, kvcache_layout)
    if not isinstance(input_k_cache, torch.Tensor) or input_k_cache.dim() != 4 or input_k_cache.shape[2:] != (1, KV_HEAD_DIM):
        raise ContractError(format_problem(op, "input_k_cache", describe(input_k_cache),
                                           f"[num_blocks, block_size, 1, {KV_HEAD_DIM}]", "pass the bf16 cache"))
    packed = pack_fp8_kv_cache(input_k_cache[..., :KV_LATENT_DIM], input_k_cache[..., KV_LATENT_DIM:],
                               scale_rule="flash_mla")
    return packed.view(torch.float8_e4m3fn)


def dequantize_k_cache(quant_k_cache: torch.Tensor,
                       kvcache_layout: FP8KVCacheLayout = FP8KVCacheLayout.V32_FP8Sparse) -> torch.Tensor:
    """[num_blocks, block_size, 1, 656] bytes (uint8 or float8_e4m3fn) -> bf16 [num_blocks, block_size, 1, 576]."""
    op = "dequantize_k_cache"
    _layout(op, kvcache_layout)
    if not isinstance(quant_k_cache, torch.Tensor) or quant_k_cache.dtype not in (torch.uint8, torch.float8_e4m3fn) \
            or quant_k_cache.shape[-1] != KV_FP8_BYTES_PER_TOKEN:
        raise ContractError(format_problem(op, "quant_k_cache", describe(quant_k_cache),
                                           f"uint8 / float8_e4m3fn [..., {KV_FP8_BYTES_PER_TOKEN}]",
                                           "pass quantize_k_cache's result"))
    return dequantize_fp8_kv_cache(quant_k_cache.view(torch.uint8), torch.bfloat16)
