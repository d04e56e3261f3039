"""FlashMLA's FP8 KV caches (its tests' quant.py helpers) written and read with FlashMLA's rule.

`quantize_k_cache(k_cache, kvcache_layout)` -> float8_e4m3fn bytes identical to FlashMLA's:
- `V32_FP8Sparse`: bf16 [num_blocks, block_size, 1, 576] -> [num_blocks, block_size, 1, 656], per tile
  of 128 latent values sf = 2^ceil(log2(max(amax / 448, 1e-4))) as fp32 (layouts.pack_fp8_kv_cache
  with scale_rule="flash_mla");
- `MODEL1_FP8Sparse` (DeepSeek-V4, d = 512): bf16 [num_blocks, block_size, 1, 512] -> pages
  [num_blocks, block_size, 1, 584] (448 e4m3 + 64 bf16 per token, then 8 scale bytes per token: 7
  UE8M0 per 64 NoPE values and a pad byte; layouts.pack_model1_kv_cache). The pad byte is 0 here
  (FlashMLA leaves it unwritten).
NaN is passed through in both. Results are contiguous (FlashMLA's test pads each block's stride;
decode accepts either). `dequantize_k_cache` is the inverse, bf16 out.
"""

from __future__ import annotations

import enum

import torch

from ..core.errors import ContractError, format_problem
from ..layouts import (KV_FP8_BYTES_PER_TOKEN, KV_HEAD_DIM, KV_LATENT_DIM, MODEL1_BYTES_PER_TOKEN, MODEL1_HEAD_DIM,
                       dequantize_fp8_kv_cache, dequantize_model1_kv_cache, pack_fp8_kv_cache, pack_model1_kv_cache)
from ..layouts.kv_cache_model1 import model1_cache_problem
from ..core.tensors import describe


class FP8KVCacheLayout(enum.Enum):
    V32_FP8Sparse = 1
    MODEL1_FP8Sparse = 2


#: (d of the bf16 cache, bytes per token of the FP8 cache) per layout
_DIMS = {FP8KVCacheLayout.V32_FP8Sparse: (KV_HEAD_DIM, KV_FP8_BYTES_PER_TOKEN),
         FP8KVCacheLayout.MODEL1_FP8Sparse: (MODEL1_HEAD_DIM, MODEL1_BYTES_PER_TOKEN)}


def _layout(op: str, kvcache_layout: FP8KVCacheLayout) -> tuple[int, int]:
    if not isinstance(kvcache_layout, FP8KVCacheLayout):
        raise ContractError(format_problem(op, "kvcache_layout", repr(kvcache_layout),
                                           "FP8KVCacheLayout.V32_FP8Sparse or FP8KVCacheLayout.MODEL1_FP8Sparse",
                                           "pass one of flash_mla.quant.FP8KVCacheLayout's members"))
    return _DIMS[kvcache_layout]


def quantize_k_cache(input_k_cache: torch.Tensor,
                     kvcache_layout: FP8KVCacheLayout = FP8KVCacheLayout.V32_FP8Sparse) -> torch.Tensor:
    """bf16 [num_blocks, block_size, 1, d] -> float8_e4m3fn [num_blocks, block_size, 1, bytes] (FlashMLA's
    bytes): d = 576 -> 656 bytes (V3.2), d = 512 -> 584 bytes (MODEL1)."""
    op = "quantize_k_cache"
    d, _ = _layout(op, kvcache_layout)
    if not isinstance(input_k_cache, torch.Tensor) or input_k_cache.dim() != 4 or input_k_cache.shape[2:] != (1, d):
        raise ContractError(format_problem(op, "input_k_cache", describe(input_k_cache),
                                           f"[num_blocks, block_size, 1, {d}] for {kvcache_layout}",
                                           "pass the bf16 cache of that layout's head dim (576 V3.2, 512 MODEL1)"))
    if kvcache_layout is FP8KVCacheLayout.MODEL1_FP8Sparse:
        return pack_model1_kv_cache(input_k_cache, scale_rule="flash_mla").view(torch.float8_e4m3fn)
    packed = pack_fp8_kv_cache(input_k_cache[..., :KV_LATENT_DIM], input_k_cache[..., KV_LATENT_DIM:],
                               scale_rule="flash_mla")
    return packed.view(torch.float8_e4m3fn)


def dequantize_k_cache(quant_k_cache: torch.Tensor,
                       kvcache_layout: FP8KVCacheLayout = FP8KVCacheLayout.V32_FP8Sparse) -> torch.Tensor:
    """[num_blocks, block_size, 1, bytes] (uint8 or float8_e4m3fn) -> bf16 [num_blocks, block_size, 1, d]:
    656 bytes -> d = 576 (V3.2), 584 bytes (pages) -> d = 512 (MODEL1)."""
    op = "dequantize_k_cache"
    _, width = _layout(op, kvcache_layout)
    if not isinstance(quant_k_cache, torch.Tensor) or quant_k_cache.dtype not in (torch.uint8, torch.float8_e4m3fn) \
            or quant_k_cache.shape[-1] != width:
        raise ContractError(format_problem(op, "quant_k_cache", describe(quant_k_cache),
                                           f"uint8 / float8_e4m3fn [..., {width}] for {kvcache_layout}",
                                           "pass quantize_k_cache's result of the same layout"))
    if kvcache_layout is FP8KVCacheLayout.MODEL1_FP8Sparse:
        problem = model1_cache_problem(quant_k_cache)
        if problem is not None:
            raise ContractError(format_problem(op, "quant_k_cache", describe(quant_k_cache),
                                               f"MODEL1 pages [num_blocks, block_size, 1, {width}]",
                                               f"{problem}; pass quantize_k_cache's result"))
        return dequantize_model1_kv_cache(quant_k_cache, torch.bfloat16)
    return dequantize_fp8_kv_cache(quant_k_cache.view(torch.uint8), torch.bfloat16)
