"""FlashMLA MODEL1 FP8 KV cache (DeepSeek-V4, d_qk = d_v = 512): 584 bytes per token, laid out per page.

Rule: a page's bytes are fixed by its block size; a token's bytes are NOT one contiguous row.
Facts from FlashMLA (tests/quant.py `FP8KVCacheLayout.MODEL1_FP8Sparse`, csrc/api/sparse_decode.h):
a token holds 448 NoPE values as float8_e4m3fn with one UE8M0 scale per 64 values (7 scales), and 64
bf16 RoPE values; d_qk = 448 + 64 = 512 and V is all 512 channels (head_dim_v = 512). A page of
`bs` tokens is `bs · 584` contiguous bytes::

    [0, bs·576)            token t at t·576: 448 e4m3 NoPE | 64 bf16 RoPE (128 bytes, little-endian)
    [bs·576, bs·584)       token t at bs·576 + t·8: 7 UE8M0 scale bytes (2^(e-127)) | 1 pad byte (0)

The paged tensor is uint8 (or float8_e4m3fn) [num_blocks, bs, 1, 584] with stride(1) = 584 and any
stride(0) >= bs·584 (FlashMLA's test pads each page to a multiple of 576 bytes): element [n, t] of
that view is NOT token t; only whole pages have meaning. Dequantized value i < 448 of a token is
e4m3[i] · 2^(e[i // 64] - 127) (exact in bf16 and fp32); values 448..511 are the RoPE.

Quantization per tile of 64: FlashMLA's rule (`scale_rule="flash_mla"`, its bytes exactly)
sf = 2^ceil(log2(max(amax / 448, 1e-4))) (smallest 2^-13, byte 0x72), NaN passed through (scale byte
0xff); this library's block rule (`"portable"`) clamps the amax instead (amax >= 1e-4, smallest sf
2^-22, byte 0x69) and refuses non-finite values. Worked example: docs/formats-model1.md.
"""

from __future__ import annotations

import torch

from ._util import require_dtype
from .constants import FP8_E4M3_MAX
from .errors import LayoutConversionError
from .fp8_scales import fp8_scale_from_amax
from .kv_cache import KVCacheFormat, _flash_mla_scale

__all__ = [
    "MODEL1_NOPE_DIM",
    "MODEL1_ROPE_DIM",
    "MODEL1_HEAD_DIM",
    "MODEL1_SCALE_TILE",
    "MODEL1_NUM_SCALES",
    "MODEL1_VALUE_BYTES",
    "MODEL1_SCALE_BYTES",
    "MODEL1_BYTES_PER_TOKEN",
    "pack_model1_kv_cache",
    "model1_kv_tokens",
    "model1_token_rows",
    "dequantize_model1_kv_cache",
    "FLASHMLA_MODEL1_FP8_KV",
]

MODEL1_NOPE_DIM = 448
MODEL1_ROPE_DIM = 64
MODEL1_HEAD_DIM = MODEL1_NOPE_DIM + MODEL1_ROPE_DIM  # 512 = d_qk = d_v
MODEL1_SCALE_TILE = 64
MODEL1_NUM_SCALES = MODEL1_NOPE_DIM // MODEL1_SCALE_TILE  # 7
#: a token's value bytes: 448 e4m3 + 64 bf16
MODEL1_VALUE_BYTES = MODEL1_NOPE_DIM + 2 * MODEL1_ROPE_DIM  # 576
#: a token's scale bytes: 7 UE8M0 + 1 pad
MODEL1_SCALE_BYTES = MODEL1_NUM_SCALES + 1  # 8
MODEL1_BYTES_PER_TOKEN = MODEL1_VALUE_BYTES + MODEL1_SCALE_BYTES  # 584
#: FlashMLA's fp8 kernels take a float8_e4m3fn view of the same bytes as well as uint8
_BYTE_DTYPES = (torch.uint8, torch.float8_e4m3fn)


def _scale_bytes(sf: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 scales (NaN allowed) -> their UE8M0 bytes (the fp32 exponent byte; NaN 0xff)."""
    return sf.to(torch.float8_e8m0fnu).view(torch.uint8)


def pack_model1_kv_cache(k_cache: torch.Tensor, scale_rule: str = "flash_mla") -> torch.Tensor:
    """bf16/fp32 pages [num_blocks, bs, 1, 512] (448 NoPE, then 64 RoPE) -> uint8 [num_blocks, bs, 1, 584].

    The result is contiguous (stride(0) = bs·584). The RoPE must be representable in bf16: with fp32
    input it is rounded to bf16 as FlashMLA's (bf16-only) caches hold it. Example (one token, tile 0
    = [448, 1, -2, 0.5, 0, ...], other tiles 0, rope[0] = 1.0, flash_mla rule): bytes 0..3 =
    7e 38 c0 30, bytes 448..449 = 80 3f, scale bytes (at bs·576) = 7f 72 72 72 72 72 72 00.
    """
    if scale_rule not in ("portable", "flash_mla"):
        raise LayoutConversionError(f"scale_rule must be 'portable' or 'flash_mla', got {scale_rule!r}")
    require_dtype("k_cache", k_cache, (torch.bfloat16, torch.float32), "pass the cache values as bf16")
    if k_cache.dim() != 4 or k_cache.shape[2] != 1 or k_cache.shape[3] != MODEL1_HEAD_DIM:
        raise LayoutConversionError(f"k_cache must be [num_blocks, block_size, 1, {MODEL1_HEAD_DIM}] (448 NoPE + "
                                    f"64 RoPE), got shape {tuple(k_cache.shape)}")
    nb, bs = k_cache.shape[:2]
    tiles = k_cache[:, :, 0, :MODEL1_NOPE_DIM].unflatten(-1, (MODEL1_NUM_SCALES, MODEL1_SCALE_TILE))
    x = tiles.float()
    if scale_rule == "flash_mla":
        # FlashMLA's operations tile by tile on [nb, bs] (amax in the input dtype): the NaN a NaN tile
        # gets depends on the tensor shape torch vectorizes over, so even its sign bit matches this way
        sfs = [_flash_mla_scale(tiles[:, :, t].abs().max(dim=-1).values.float()) for t in range(MODEL1_NUM_SCALES)]
        q = torch.stack([(x[:, :, t] / sfs[t].unsqueeze(-1)).to(torch.float8_e4m3fn)
                         for t in range(MODEL1_NUM_SCALES)], dim=2)
        sf = torch.stack(sfs, dim=-1)
    else:
        if not bool(torch.isfinite(x).all()):
            raise LayoutConversionError("k_cache NoPE values contain NaN or inf; the portable rule cannot carry them "
                                        "(scale_rule='flash_mla' passes them through as FlashMLA does)")
        sf = fp8_scale_from_amax(x.abs().amax(dim=-1), use_ue8m0=True)
        q = (x / sf.unsqueeze(-1)).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    page = torch.zeros(nb, bs * MODEL1_BYTES_PER_TOKEN, dtype=torch.uint8, device=k_cache.device)
    values = page[:, :bs * MODEL1_VALUE_BYTES].view(nb, bs, MODEL1_VALUE_BYTES)
    values[..., :MODEL1_NOPE_DIM].copy_(q.view(torch.uint8).flatten(-2))
    values[..., MODEL1_NOPE_DIM:].copy_(k_cache[:, :, 0, MODEL1_NOPE_DIM:].to(torch.bfloat16).contiguous()
                                        .view(torch.uint8))
    scales = page[:, bs * MODEL1_VALUE_BYTES:].view(nb, bs, MODEL1_SCALE_BYTES)
    scales[..., :MODEL1_NUM_SCALES].copy_(_scale_bytes(sf))
    return page.view(nb, bs, 1, MODEL1_BYTES_PER_TOKEN)


def _page_views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values uint8 [nb, bs, 576], scales uint8 [nb, bs, 8]) views of a MODEL1 cache's pages."""
    problem = model1_cache_problem(cache)
    if problem is not None:
        raise LayoutConversionError(f"not a MODEL1 KV cache: {problem}")
    nb, bs = cache.shape[:2]
    page = cache.view(torch.uint8).as_strided((nb, bs * MODEL1_BYTES_PER_TOKEN), (cache.stride(0), 1))
    values = page[:, :bs * MODEL1_VALUE_BYTES].unflatten(1, (bs, MODEL1_VALUE_BYTES))
    scales = page[:, bs * MODEL1_VALUE_BYTES:].unflatten(1, (bs, MODEL1_SCALE_BYTES))
    return values, scales


def model1_cache_problem(cache: torch.Tensor) -> str | None:
    """None when `cache` is a paged MODEL1 cache (uint8/float8_e4m3fn [nb, bs, 1, 584], each page's
    bs·584 bytes contiguous), else why not."""
    if not isinstance(cache, torch.Tensor) or cache.dtype not in _BYTE_DTYPES:
        return f"the cache is {getattr(cache, 'dtype', type(cache).__name__)}, expected uint8"
    if cache.dim() != 4 or cache.shape[2] != 1 or cache.shape[3] != MODEL1_BYTES_PER_TOKEN:
        return (f"the cache has shape {tuple(cache.shape)}, expected uint8 [num_blocks, block_size, 1, "
                f"{MODEL1_BYTES_PER_TOKEN}]")
    nb, bs = cache.shape[:2]
    if cache.stride(3) != 1 or (bs > 1 and cache.stride(1) != MODEL1_BYTES_PER_TOKEN) \
            or (nb > 1 and cache.stride(0) < bs * MODEL1_BYTES_PER_TOKEN):
        return (f"the cache has strides {cache.stride()}; a MODEL1 page's {bs}·{MODEL1_BYTES_PER_TOKEN} bytes must "
                f"be contiguous (stride(1) = {MODEL1_BYTES_PER_TOKEN}, stride(0) >= block_size·"
                f"{MODEL1_BYTES_PER_TOKEN})")
    return None


def model1_token_rows(cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The tokens at (blocks, offsets) as uint8 [..., 584] = [576 value bytes | 8 scale bytes]: exactly the
    bytes of a MODEL1 page of block size 1, so `.unsqueeze(-2).unsqueeze(-2)` of a flat result is a cache."""
    values, scales = _page_views(cache)
    return torch.cat([values[blocks, offsets], scales[blocks, offsets]], dim=-1)


def model1_kv_tokens(cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dequantized tokens at (blocks, offsets) (int tensors of one shape S) -> `dtype` [*S, 1, 512]."""
    if dtype not in (torch.bfloat16, torch.float32):
        raise LayoutConversionError(f"dtype must be bfloat16 or float32, got {dtype}")
    values, scales = _page_views(cache)
    v = values[blocks, offsets]                                             # [*S, 576]
    e = scales[blocks, offsets][..., :MODEL1_NUM_SCALES]                    # [*S, 7]
    sf = e.contiguous().view(torch.float8_e8m0fnu).float()
    nope = v[..., :MODEL1_NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    nope = (nope.unflatten(-1, (MODEL1_NUM_SCALES, MODEL1_SCALE_TILE)) * sf.unsqueeze(-1)).flatten(-2)
    rope = v[..., MODEL1_NOPE_DIM:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=-1).to(dtype).unsqueeze(-2)


def dequantize_model1_kv_cache(cache: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """uint8 pages [nb, bs, 1, 584] -> `dtype` [nb, bs, 1, 512] (exact: e4m3 times a power of two fits bf16)."""
    if model1_cache_problem(cache) is not None:
        _page_views(cache)  # raises with the reason
    nb, bs = cache.shape[:2]
    blocks = torch.arange(nb, device=cache.device)[:, None].expand(nb, bs)
    offsets = torch.arange(bs, device=cache.device)[None, :].expand(nb, bs)
    return model1_kv_tokens(cache, blocks, offsets, dtype)


def _same_model1(cache: torch.Tensor) -> torch.Tensor:
    problem = model1_cache_problem(cache)
    if problem is not None:
        raise LayoutConversionError(f"not a MODEL1 KV cache: {problem}")
    return cache


#: FlashMLA's MODEL1 pages, the logical form of the d = 512 cache (every backend reads it as is)
FLASHMLA_MODEL1_FP8_KV = KVCacheFormat(
    name="flashmla-model1-fp8-kv-paged",
    row=("page of bs tokens: [0, bs·576) per token 448 e4m3 nope | 64 bf16 rope; [bs·576, bs·584) per token "
         "7 UE8M0 scales (one per 64) | 1 pad"),
    encode=_same_model1,
    decode=_same_model1,
    width=MODEL1_BYTES_PER_TOKEN,
    head_dim=MODEL1_HEAD_DIM,
    gather=model1_kv_tokens,
    problem=model1_cache_problem,
)
