"""DeepGEMM's paged indexer-key cache (DeepSeek-V3.2's lightning indexer): FP8 keys with one fp32
scale per token, the values and the scales of a block stored apart.

Block layout (one block of `block_kv` tokens, head dim D; the block's bytes are contiguous)::

    [0, block_kv * D)                      float8_e4m3fn values, token t at [t * D, (t + 1) * D)
    [block_kv * D, block_kv * (D + 4))     fp32 scales, little-endian, token t at block_kv * D + 4 t

The tensor is uint8 [num_blocks, block_kv, 1, D + 4] with stride(1) = D + 4 and stride(3) = 1 — a
view sized to the block's bytes, not a per-token record: element [b, t] is NOT token t's bytes.
stride(0) may exceed block_kv * (D + 4) (a block inside a larger page) and must be a multiple of 4.

Quantization rule (DeepGEMM's test generator, which the V3.2 inference matches): per token,
sf = max(amax, 1e-4) / 448 and value = fp8(x * (1 / sf)) — no power-of-two rounding, so decode is
value · sf in fp32.
"""

from __future__ import annotations

import torch

from ._util import require_dtype
from .constants import FP8_E4M3_MAX, SCALE_AMAX_FLOOR
from .errors import LayoutConversionError

__all__ = ["INDEXER_SCALE_BYTES", "indexer_cache_views", "pack_indexer_cache", "quantize_indexer_keys",
           "dequantize_indexer_cache"]

#: bytes of one token's scale (fp32)
INDEXER_SCALE_BYTES = 4


def quantize_indexer_keys(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (bf16 / fp32) -> (float8_e4m3fn [..., D], fp32 [...]) by the rule above."""
    if not x.is_floating_point() or x.dim() < 1:
        raise LayoutConversionError(f"quantize_indexer_keys: x is {x.dtype} with {x.dim()} dims; expected a "
                                    "floating-point tensor [..., D]")
    amax = x.abs().float().amax(dim=-1, keepdim=True).clamp(min=SCALE_AMAX_FLOOR)
    sf = amax / FP8_E4M3_MAX
    values = (x.float() * (1.0 / sf)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return values, sf.squeeze(-1)


def pack_indexer_cache(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(float8_e4m3fn [blocks, block_kv, D], fp32 [blocks, block_kv]) -> uint8 [blocks, block_kv, 1, D + 4]."""
    require_dtype("values", values, (torch.float8_e4m3fn,), "quantize the keys with quantize_indexer_keys")
    require_dtype("scales", scales, (torch.float32,), "pass the fp32 per-token scales")
    if values.dim() != 3 or tuple(scales.shape) != tuple(values.shape[:2]):
        raise LayoutConversionError(f"pack_indexer_cache: values {tuple(values.shape)} and scales "
                                    f"{tuple(scales.shape)}; expected [blocks, block_kv, D] and [blocks, block_kv]")
    blocks, block_kv, d = values.shape
    out = torch.empty(blocks, block_kv * (d + INDEXER_SCALE_BYTES), dtype=torch.uint8, device=values.device)
    out[:, : block_kv * d] = values.contiguous().view(torch.uint8).reshape(blocks, block_kv * d)
    out[:, block_kv * d:] = scales.contiguous().view(torch.uint8).reshape(blocks, block_kv * INDEXER_SCALE_BYTES)
    return out.view(blocks, block_kv, 1, d + INDEXER_SCALE_BYTES)


def indexer_cache_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [blocks, block_kv, 1, D + 4] -> views (float8_e4m3fn [blocks, block_kv, D], fp32 [blocks,
    block_kv]) of the same memory (writing them writes the cache)."""
    require_dtype("kv_cache", kv_cache, (torch.uint8,), "pass the cache's uint8 bytes (pack_indexer_cache)")
    if kv_cache.dim() != 4 or kv_cache.shape[2] != 1 or kv_cache.shape[3] <= INDEXER_SCALE_BYTES:
        raise LayoutConversionError(f"indexer_cache_views: kv_cache {tuple(kv_cache.shape)}; expected "
                                    "[blocks, block_kv, 1, D + 4]")
    blocks, block_kv, _, width = kv_cache.shape
    d = width - INDEXER_SCALE_BYTES
    row = kv_cache.stride(0)
    if kv_cache.stride(3) != 1 or kv_cache.stride(1) != width or row % INDEXER_SCALE_BYTES or row < block_kv * width:
        raise LayoutConversionError(f"indexer_cache_views: kv_cache strides {kv_cache.stride()}; expected "
                                    f"(a multiple of 4 >= {block_kv * width}, {width}, *, 1)")
    if (block_kv * d + kv_cache.storage_offset()) % INDEXER_SCALE_BYTES:
        raise LayoutConversionError(f"indexer_cache_views: the scales of a block start at byte {block_kv * d} "
                                    f"(storage offset {kv_cache.storage_offset()}); fp32 scales need a multiple of 4")
    values = torch.as_strided(kv_cache, (blocks, block_kv, d), (row, d, 1)).view(torch.float8_e4m3fn)
    scale_bytes = torch.as_strided(kv_cache, (blocks, block_kv * INDEXER_SCALE_BYTES), (row, 1),
                                   kv_cache.storage_offset() + block_kv * d)
    return values, scale_bytes.view(torch.float32)


def dequantize_indexer_cache(kv_cache: torch.Tensor) -> torch.Tensor:
    """uint8 [blocks, block_kv, 1, D + 4] -> fp32 [blocks, block_kv, D]: value · sf per token."""
    values, scales = indexer_cache_views(kv_cache)
    return values.float() * scales.unsqueeze(-1)
