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

The FP4 form (DeepGEMM's `fp8_fp4_paged_mqa_logits` with an FP4 cache, SM100) has the same block
layout with D/2 + 4 bytes per token: the token's D channels as packed E2M1 codes (two per byte,
low nibble first) and one int32 word of UE8M0 exponents, one per 32 channels (D <= 128; unused
exponent bytes are 127, i.e. 1.0). Decode is code value · 2^(e - 127) per 32 channels, exact in fp32.
The same pair (packed codes [..., D/2], int32 words [...]) is DeepGEMM's FP4 query and prefill key.
"""

from __future__ import annotations

import torch

from ._util import require_dtype
from .constants import FP8_E4M3_MAX, SCALE_AMAX_FLOOR
from .errors import LayoutConversionError
from .fp4 import e2m1_decode, e2m1_encode, fp4_scale_from_amax, pack_e2m1, unpack_e2m1
from .ue8m0 import ue8m0_exponents, ue8m0_to_fp32

__all__ = ["INDEXER_SCALE_BYTES", "FP4_INDEXER_BLOCK", "indexer_cache_views", "pack_indexer_cache",
           "quantize_indexer_keys", "dequantize_indexer_cache", "quantize_fp4_rows", "dequantize_fp4_rows", "dequantize_indexer_cache_fp4"]
#: the exponent byte of 1.0: how the FP4 form pads a word's unused exponents (as DeepGEMM does)
_UNIT_EXPONENT = 127

#: bytes of one token's scale (fp32, or the FP4 form's int32 word of exponents)
INDEXER_SCALE_BYTES = 4
#: channels per UE8M0 exponent in the FP4 form
FP4_INDEXER_BLOCK = 32


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
    """(float8_e4m3fn [blocks, block_kv, D], fp32 [blocks, block_kv]) -> uint8 [blocks, block_kv, 1, D + 4];
    the FP4 form: (int8/uint8 packed E2M1 [blocks, block_kv, D/2], int32 exponent words [blocks,
    block_kv]) -> uint8 [blocks, block_kv, 1, D/2 + 4]."""
    fp4 = values.dtype in (torch.int8, torch.uint8)
    require_dtype("values", values, (torch.float8_e4m3fn, torch.int8, torch.uint8),
                  "quantize the keys with quantize_indexer_keys (FP8) or per_token_cast_to_fp4 (FP4)")
    require_dtype("scales", scales, (torch.int32,) if fp4 else (torch.float32,),
                  "pass the int32 exponent words of FP4 keys" if fp4 else "pass the fp32 per-token scales")
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


def quantize_fp4_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (D a multiple of 32, <= 128) -> the FP4 form (uint8 packed E2M1 [..., D/2], int32
    words [...]): per 32 channels sf = ceil_to_ue8m0(amax / 6), codes = e2m1_encode(x / sf) (ties to
    even, signed zero). DeepGEMM's per_token_cast_to_fp4 (use_ue8m0, packed, gran_k 32) has the same
    scales; it rounds ties toward zero and writes +0, so a few codes differ; the bytes decode alike."""
    d = x.shape[-1]
    blocks = d // FP4_INDEXER_BLOCK
    if not x.is_floating_point() or d % FP4_INDEXER_BLOCK or blocks > INDEXER_SCALE_BYTES:
        raise LayoutConversionError(f"quantize_fp4_rows: x is {x.dtype} [..., {d}]; expected floating point with D "
                                    "a multiple of 32 up to 128")
    xb = x.float().reshape(*x.shape[:-1], blocks, FP4_INDEXER_BLOCK)
    sf = fp4_scale_from_amax(xb.abs().amax(dim=-1))
    packed = pack_e2m1(e2m1_encode(xb / sf[..., None]).reshape(*x.shape[:-1], d))
    exponents = torch.full((*x.shape[:-1], INDEXER_SCALE_BYTES), _UNIT_EXPONENT, dtype=torch.uint8, device=x.device)
    exponents[..., :blocks] = ue8m0_exponents(sf)
    return packed, exponents.view(torch.int32).squeeze(-1)


def dequantize_fp4_rows(packed: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """(int8/uint8 packed E2M1 [..., D/2], int32 UE8M0 words [...]) -> fp32 [..., D], D a multiple of
    32 and at most 128 (the exponents of one word)."""
    require_dtype("packed", packed, (torch.int8, torch.uint8), "pass the packed E2M1 codes")
    require_dtype("words", words, (torch.int32,), "pass one int32 word of UE8M0 exponents per row")
    d = packed.shape[-1] * 2
    blocks = d // FP4_INDEXER_BLOCK
    if d % FP4_INDEXER_BLOCK or blocks > INDEXER_SCALE_BYTES or tuple(words.shape) != tuple(packed.shape[:-1]):
        raise LayoutConversionError(f"dequantize_fp4_rows: packed {tuple(packed.shape)} with words "
                                    f"{tuple(words.shape)}; expected D = 2 * packed.shape[-1] a multiple of 32 "
                                    "up to 128 and one word per row")
    values = e2m1_decode(unpack_e2m1(packed)) + 0.0  # the negative-zero code decodes as +0
    exponents = words.contiguous().view(torch.uint8).reshape(*words.shape, INDEXER_SCALE_BYTES)[..., :blocks]
    scale = ue8m0_to_fp32(exponents.contiguous())
    return (values.reshape(*values.shape[:-1], blocks, FP4_INDEXER_BLOCK) * scale[..., None]).flatten(-2)


def dequantize_indexer_cache_fp4(kv_cache: torch.Tensor) -> torch.Tensor:
    """The FP4 form uint8 [blocks, block_kv, 1, D/2 + 4] -> fp32 [blocks, block_kv, D]."""
    values, scales = indexer_cache_views(kv_cache)
    return dequantize_fp4_rows(values.view(torch.uint8), scales.view(torch.int32))
