"""FlashMLA V3.2 FP8 KV cache: one token = 656 bytes.

Rule: byte offsets are fixed; quantization follows the block rule (amax clamped >= 1e-4,
sf = amax / 448, rounded UP to a power of two) so dequantization is exact multiplication.
FlashMLA's own quantizer clamps the SCALE instead (sf = 2^ceil(log2(max(amax / 448, 1e-4))), so
its smallest scale is 2^-13, ours 2^-22) and lets NaN through: `scale_rule="flash_mla"` writes its
bytes exactly. Both decode the same way.

Token layout (byte offsets)::

    [0, 512)    512 float8_e4m3fn latent values q[i] = clamp(x[i] / sf[i // 128], -448, 448)
    [512, 528)  4 fp32 scales sf[t], little-endian, one per 128 latent values
    [528, 656)  64 bf16 RoPE values, little-endian, copied unchanged

A paged cache is uint8 [num_blocks, block_size, 1, 656] with stride(1) = 656.

Ascend (CANN `npu_kv_quant_sparse_flash_attention`, Ascend 950 with float8_e4m3fn keys) keeps the
same three parts in another order, [nope | rope | scales]; `flashmla_kv_to_ascend` and
`ascend_kv_to_flashmla` move the bytes (exact, once per cache at ingest)::

    FlashMLA  [0, 512) nope | [512, 528) 4 fp32 scales | [528, 656) 64 bf16 rope
    Ascend    [0, 512) nope | [512, 640) 64 bf16 rope  | [640, 656) 4 fp32 scales

A paged cache's byte order is a `KVCacheFormat` value (`FLASHMLA_FP8_KV`, `ASCEND_FP8_KV`,
`ASCEND_BF16_KV`): one frozen object per order, registered by name, whose `encode` takes FlashMLA's
rows (the logical form, what the contract's reference reads) to its storage and `decode` brings them
back. The two 656-byte orders are byte moves (bit for bit both ways).

Atlas A2/A3 have no FP8 datatype, and their KV-quant attention op takes int8 nope values only
(torch_npu-npu_kv_quant_sparse_flash_attention.md, 约束说明: A2/A3 "参数key、value数据类型仅支持int8");
an e4m3 tile times a power of two is not an int8 tile times one fp32 scale in general (e4m3 spans
2^-9..448 within a tile, int8 covers 1..127), so an int8 cache would re-quantize, not convert.
`ASCEND_BF16_KV` stores the rows' exact values instead, dequantized once (1152 bytes per token)::

    FlashMLA  [0, 512) e4m3 nope | [512, 528) 4 fp32 scales | [528, 656) 64 bf16 rope   (uint8 [..., 656])
    A2/A3     [0, 512) bf16 nope = e4m3 x scale (exact) | [512, 576) bf16 rope           (bf16 [..., 576])
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

import torch

from ._util import require_dtype
from .constants import (
    ASCEND_KV_ROPE_OFFSET,
    ASCEND_KV_SCALES_OFFSET,
    FP8_E4M3_MAX,
    KV_FP8_BYTES_PER_TOKEN,
    KV_HEAD_DIM,
    KV_LATENT_DIM,
    KV_NUM_SCALES,
    KV_ROPE_DIM,
    KV_ROPE_OFFSET,
    KV_SCALE_TILE,
    KV_SCALES_OFFSET,
)
from .errors import LayoutConversionError
from .fp8_scales import fp8_scale_from_amax

__all__ = [
    "pack_fp8_kv_cache",
    "unpack_fp8_kv_cache",
    "dequantize_fp8_kv_cache",
    "flashmla_kv_to_ascend",
    "ascend_kv_to_flashmla",
    "SCALE_RULES",
    "KVCacheFormat",
    "FLASHMLA_FP8_KV",
    "ASCEND_FP8_KV",
    "ASCEND_BF16_KV",
    "flashmla_kv_to_bf16_values",
    "bf16_values_to_flashmla_kv",
    "kv_cache_format_named",
    "known_kv_cache_formats",
]

#: how pack_fp8_kv_cache picks a tile's scale: this library's block rule, or FlashMLA's
SCALE_RULES = ("portable", "flash_mla")
#: FlashMLA clamps the tile scale (not the amax) at this before rounding it to a power of two
FLASH_MLA_SCALE_FLOOR = 1e-4


def _flash_mla_scale(amax: torch.Tensor) -> torch.Tensor:
    """FlashMLA's tile scale, computed as FlashMLA computes it: 2^ceil(log2(max(amax / 448, 1e-4)))
    in fp32 (NaN stays NaN). Example: amax 0 -> 2^-13 (bytes 00 00 00 39), amax 448 -> 1.0."""
    return torch.pow(2, torch.clamp_min(amax / FP8_E4M3_MAX, FLASH_MLA_SCALE_FLOOR).log2().ceil()).to(torch.float32)


def pack_fp8_kv_cache(latent: torch.Tensor, rope: torch.Tensor, scale_rule: str = "portable") -> torch.Tensor:
    """Quantize and pack tokens: latent bf16/fp32 `[..., 512]`, rope bf16 `[..., 64]` -> uint8 `[..., 656]`.

    Per tile t of 128 latent values: amax = max |x| clamped to >= 1e-4 (the amax is clamped, not the
    scale, so an all-zero tile gets sf = 2^-22), sf = ceil_to_ue8m0(amax / 448), q = x / sf clamped
    to [-448, 448] and rounded to e4m3 (nearest even). The rope must already be bf16: converting
    it here would round it silently. Non-finite latent values raise LayoutConversionError.

    Example (tile 0 = [448, 1, -2, 0.5, 0...], rope[0] = 1.0): bytes 0..3 = 7e 38 c0 30,
    bytes 512..515 = 00 00 80 3f (sf 1.0), bytes 528..529 = 80 3f.

    scale_rule="flash_mla" reproduces FlashMLA's quantize_k_cache byte for byte: sf =
    2^ceil(log2(max(amax / 448, 1e-4))) (an all-zero tile gets 2^-13, bytes 00 00 00 39, where the
    portable rule gives 2^-22, bytes 00 00 80 34), q = x / sf without a clamp, and NaN/inf are not
    refused: they flow into the tile's scale and values as in FlashMLA (its tests fill unused cache
    slots with NaN before quantizing).
    """
    if scale_rule not in SCALE_RULES:
        raise LayoutConversionError(f"scale_rule must be one of {SCALE_RULES}, got {scale_rule!r}")
    require_dtype("latent", latent, (torch.bfloat16, torch.float32), "pass the latent as bf16 or fp32")
    require_dtype("rope", rope, (torch.bfloat16,), "the cache stores RoPE as bf16; pass rope.to(torch.bfloat16)")
    if latent.dim() == 0 or latent.shape[-1] != KV_LATENT_DIM or rope.dim() == 0 or rope.shape[-1] != KV_ROPE_DIM:
        raise LayoutConversionError(
            f"expected latent [..., {KV_LATENT_DIM}] and rope [..., {KV_ROPE_DIM}], "
            f"got {tuple(latent.shape)} and {tuple(rope.shape)}"
        )
    if latent.shape[:-1] != rope.shape[:-1]:
        raise LayoutConversionError(f"latent {tuple(latent.shape)} and rope {tuple(rope.shape)} differ in leading dims")
    x = latent.float().unflatten(-1, (KV_NUM_SCALES, KV_SCALE_TILE))
    if scale_rule == "flash_mla":
        sf = _flash_mla_scale(latent.abs().unflatten(-1, (KV_NUM_SCALES, KV_SCALE_TILE)).amax(dim=-1).float())
        q = (x / sf.unsqueeze(-1)).to(torch.float8_e4m3fn)
    else:
        if not bool(torch.isfinite(x).all()):
            raise LayoutConversionError("latent contains NaN or inf; the FP8 cache cannot carry them")
        sf = fp8_scale_from_amax(x.abs().amax(dim=-1), use_ue8m0=True)  # [..., 4]
        q = (x / sf.unsqueeze(-1)).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    out = torch.empty((*latent.shape[:-1], KV_FP8_BYTES_PER_TOKEN), dtype=torch.uint8, device=latent.device)
    out[..., :KV_SCALES_OFFSET].copy_(q.view(torch.uint8).flatten(-2))
    out[..., KV_SCALES_OFFSET:KV_ROPE_OFFSET].copy_(sf.contiguous().view(torch.uint8))
    out[..., KV_ROPE_OFFSET:].copy_(rope.contiguous().view(torch.uint8))
    return out


def _check_packed(packed: torch.Tensor) -> None:
    require_dtype("packed", packed, (torch.uint8,), "pass the uint8 cache returned by pack_fp8_kv_cache")
    if packed.dim() == 0 or packed.shape[-1] != KV_FP8_BYTES_PER_TOKEN:
        raise LayoutConversionError(
            f"packed must be uint8 [..., {KV_FP8_BYTES_PER_TOKEN}], got shape {tuple(packed.shape)}"
        )


def unpack_fp8_kv_cache(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split uint8 `[..., 656]` tokens into (latent fp32 `[..., 512]` = q * sf, rope bf16 `[..., 64]`).

    The latent dequantization is exact (e4m3 times a power of two fits fp32).
    """
    _check_packed(packed)
    q = packed[..., :KV_SCALES_OFFSET].contiguous().view(torch.float8_e4m3fn)
    sf = packed[..., KV_SCALES_OFFSET:KV_ROPE_OFFSET].contiguous().view(torch.float32)
    rope = packed[..., KV_ROPE_OFFSET:].contiguous().view(torch.bfloat16)
    latent = (q.float().unflatten(-1, (KV_NUM_SCALES, KV_SCALE_TILE)) * sf.unsqueeze(-1)).flatten(-2)
    return latent, rope


def dequantize_fp8_kv_cache(packed: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """uint8 `[..., 656]` -> `[..., 576]` (512 dequantized latent, then 64 RoPE) in bf16 (default) or fp32.

    bf16 loses nothing: an e4m3 value (3 mantissa bits) times a power of two fits bf16's 8 bits,
    and bf16 has fp32's exponent range.
    """
    if dtype not in (torch.bfloat16, torch.float32):
        raise LayoutConversionError(f"dtype must be bfloat16 or float32, got {dtype}")
    latent, rope = unpack_fp8_kv_cache(packed)
    out = torch.empty((*packed.shape[:-1], KV_HEAD_DIM), dtype=dtype, device=packed.device)
    out[..., :KV_LATENT_DIM].copy_(latent)
    out[..., KV_LATENT_DIM:].copy_(rope)
    return out


def _move_parts(packed: torch.Tensor, src: tuple[int, int, int], dst: tuple[int, int, int]) -> torch.Tensor:
    """Copy the nope / scales / rope byte ranges of every token from offsets `src` to `dst`.

    Offsets are (nope, scales, rope) starts; lengths are fixed (512, 16, 128). Returns a new
    contiguous uint8 tensor of the same shape.
    """
    _check_packed(packed)
    lengths = (KV_LATENT_DIM, KV_ROPE_OFFSET - KV_SCALES_OFFSET, KV_FP8_BYTES_PER_TOKEN - KV_ROPE_OFFSET)
    out = torch.empty(packed.shape, dtype=torch.uint8, device=packed.device)
    for s, d, n in zip(src, dst, lengths):
        out[..., d : d + n].copy_(packed[..., s : s + n])
    return out


_FLASHMLA_PARTS = (0, KV_SCALES_OFFSET, KV_ROPE_OFFSET)
_ASCEND_PARTS = (0, ASCEND_KV_SCALES_OFFSET, ASCEND_KV_ROPE_OFFSET)


def flashmla_kv_to_ascend(packed: torch.Tensor) -> torch.Tensor:
    """FlashMLA 656-byte tokens `[..., 656]` -> the Ascend order [nope | rope | scales], same shape.

    Bytes 0..511 stay; FlashMLA's scale bytes 512..527 go to 640..655 and its RoPE bytes
    528..655 to 512..639. Example (the token of `pack_fp8_kv_cache`'s docstring): Ascend bytes
    512..513 = 80 3f (rope[0] = 1.0) and 640..643 = 00 00 80 3f (scale 1.0).
    """
    return _move_parts(packed, _FLASHMLA_PARTS, _ASCEND_PARTS)


def ascend_kv_to_flashmla(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `flashmla_kv_to_ascend`: [nope | rope | scales] tokens back to [nope | scales | rope]."""
    return _move_parts(packed, _ASCEND_PARTS, _FLASHMLA_PARTS)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Elementwise equal, NaN matching NaN (FlashMLA's tests quantize NaN into unused slots)."""
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def flashmla_kv_to_bf16_values(packed: torch.Tensor) -> torch.Tensor:
    """FlashMLA 656-byte tokens uint8 `[..., 656]` -> their values bf16 `[..., 576]` (512 latent, 64 RoPE).

    Exact for the format's power-of-two scales: an e4m3 value (4 significant bits) times 2^e fits
    bf16 (8 bits, fp32's exponent range). A scale that is not a power of two would round the
    product: LayoutConversionError instead. Example (the token of `pack_fp8_kv_cache`'s docstring):
    values [448, 1, -2, 0.5, 0, ...] as bf16 bytes 0x43e0 0x3f80 0xc000 0x3f00, then rope[0] = 0x3f80.
    """
    values = dequantize_fp8_kv_cache(packed, torch.float32)
    out = values.to(torch.bfloat16)
    if not _same_values(out.float(), values):
        raise LayoutConversionError("a latent scale is not a power of two, so its values do not fit bf16 exactly; "
                                    "quantize the cache with pack_fp8_kv_cache (power-of-two scales)")
    return out


def bf16_values_to_flashmla_kv(values: torch.Tensor) -> torch.Tensor:
    """bf16 `[..., 576]` values -> FlashMLA 656-byte tokens, quantized with the portable block rule.

    Values that came from a FlashMLA row (e4m3 x sf, sf >= 2^-22 a power of two, as both scale rules
    give) come back as the same values: the new scale sf' = ceil_pow2(max(amax, 1e-4) / 448) is
    <= sf, so q' = q x sf / sf' only shifts exponents and stays within +-448. The bytes may differ
    from the original row (a smaller tile scale, or FlashMLA's 2^-13 floor), the values do not.
    Non-finite values raise LayoutConversionError (pack_fp8_kv_cache's rule).
    """
    require_dtype("values", values, (torch.bfloat16,), "pass the bf16 rows of an ASCEND_BF16_KV cache")
    if values.dim() == 0 or values.shape[-1] != KV_HEAD_DIM:
        raise LayoutConversionError(f"values must be bf16 [..., {KV_HEAD_DIM}], got shape {tuple(values.shape)}")
    return pack_fp8_kv_cache(values[..., :KV_LATENT_DIM], values[..., KV_LATENT_DIM:].contiguous())


# ---------------------------------------------------------------------------------------------
# KV-cache Formats: the byte order of a paged FP8 cache, one value per order


def _same(packed: torch.Tensor) -> torch.Tensor:
    _check_packed(packed)
    return packed


@dataclasses.dataclass(frozen=True, eq=False)
class KVCacheFormat:
    """How a paged FP8 KV cache's rows are stored. Compared by identity: one object per name.

    name:   unique, e.g. "ascend-fp8-kv-nope-rope-scales"
    row:    the row's byte ranges in words, e.g. "[0, 512) nope | [512, 528) 4 fp32 scales | [528, 656) rope"
    encode: FlashMLA-order rows uint8 [..., 656] -> rows in this storage (a new tensor unless the
            storage is FlashMLA's own)
    decode: rows in this storage -> FlashMLA-order rows (the inverse: bit for bit for the 656-byte
            orders; for a values storage the same values, re-quantized with the portable block rule)
    dtype, width: a stored row is `dtype [..., width]` (uint8 656 for the byte orders)
    holds_values: the rows are the dequantized values themselves (no scales): kernels read them as a
            bf16 cache, the reference reads them as values
    head_dim: channels of a dequantized token (576 for the V3.2 orders; 512 for MODEL1)
    gather: None when a stored row is one token; else `(cache, blocks, offsets, dtype) -> [..., 1, head_dim]`,
            the dequantized tokens of a format whose bytes mean something only per page (MODEL1)
    problem: None, or `(cache) -> str | None` replacing `check`'s shape test (a paged format's strides)
    """

    name: str
    row: str
    encode: Callable[[torch.Tensor], torch.Tensor] = dataclasses.field(repr=False)
    decode: Callable[[torch.Tensor], torch.Tensor] = dataclasses.field(repr=False)
    dtype: torch.dtype = torch.uint8
    width: int = KV_FP8_BYTES_PER_TOKEN
    head_dim: int = KV_HEAD_DIM
    gather: Callable[..., torch.Tensor] | None = dataclasses.field(default=None, repr=False)
    problem: Callable[[torch.Tensor], str | None] | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        with _KV_LOCK:
            if self.name in _KV_FORMATS:
                raise ValueError(f"a KV-cache Format named {self.name!r} is already defined")
            _KV_FORMATS[self.name] = self

    @property
    def holds_values(self) -> bool:
        return self.dtype != torch.uint8

    @property
    def bytes_per_token(self) -> int:
        return self.width * torch.empty((), dtype=self.dtype).element_size()

    @property
    def paged(self) -> bool:
        """A token's bytes are not one stored row: only whole pages (and `tokens`) have meaning."""
        return self.gather is not None

    def tokens(self, cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dequantized tokens at (blocks, offsets) of a paged cache [nb, bs, 1, width] -> [..., 1, head_dim]."""
        if self.gather is not None:
            return self.gather(cache, blocks, offsets, dtype)
        return self.dequantize(cache[blocks, offsets], dtype)

    def dequantize(self, rows: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Rows in this storage -> `[..., head_dim]` (V3.2: 512 latent, 64 RoPE) in bf16 or fp32, exact.
        A paged format takes whole pages [nb, bs, 1, width]."""
        if self.gather is not None:
            nb, bs = rows.shape[:2]
            blocks = torch.arange(nb, device=rows.device)[:, None].expand(nb, bs)
            offsets = torch.arange(bs, device=rows.device)[None, :].expand(nb, bs)
            return self.gather(rows, blocks, offsets, dtype)
        if self.holds_values:
            if dtype not in (torch.bfloat16, torch.float32):
                raise LayoutConversionError(f"dtype must be bfloat16 or float32, got {dtype}")
            return rows.to(dtype)
        return dequantize_fp8_kv_cache(self.decode(rows), dtype)

    def zeros(self, num_blocks: int, block_size: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Zeroed pages [num_blocks, block_size, 1, width] of this storage (zero rows in every storage)."""
        return torch.zeros(num_blocks, block_size, 1, self.width, dtype=self.dtype, device=device)

    def check(self, cache: torch.Tensor) -> str | None:
        """None when `cache` is a paged [num_blocks, block_size, 1, width] cache of this storage, else why not."""
        if self.problem is not None:
            return self.problem(cache)
        kind = str(self.dtype).replace("torch.", "")
        if not isinstance(cache, torch.Tensor) or cache.dtype != self.dtype:
            return f"the cache is {getattr(cache, 'dtype', type(cache).__name__)}, expected {kind}"
        if cache.dim() != 4 or cache.shape[2] != 1 or cache.shape[3] != self.width:
            return (f"the cache has shape {tuple(cache.shape)}, expected {kind} [num_blocks, block_size, 1, "
                    f"{self.width}]")
        return None

    def describe(self) -> str:
        return f"{self.name}: {self.bytes_per_token}-byte KV row {self.row}"

    def __str__(self) -> str:
        return self.name

    @property
    def signature(self) -> tuple[str, str]:
        """What run-time selection keys on: the name (one object per name)."""
        return ("kv-cache-format", self.name)

    def __reduce__(self) -> tuple[Callable[[str], "KVCacheFormat"], tuple[str]]:
        return kv_cache_format_named, (self.name,)


_KV_LOCK = threading.Lock()
_KV_FORMATS: dict[str, KVCacheFormat] = {}


def kv_cache_format_named(name: str) -> KVCacheFormat:
    """The KV-cache Format registered under `name`; KeyError listing the known ones if none."""
    try:
        return _KV_FORMATS[name]
    except KeyError:
        raise KeyError(f"no KV-cache Format named {name!r} (known: {', '.join(sorted(_KV_FORMATS))})") from None


def known_kv_cache_formats() -> dict[str, KVCacheFormat]:
    """Every defined KV-cache Format, by name."""
    return dict(_KV_FORMATS)


#: FlashMLA V3.2's row, the logical form (cpu and nvidia read it as is)
FLASHMLA_FP8_KV = KVCacheFormat(
    name="flashmla-fp8-kv-nope-scales-rope",
    row="[0, 512) e4m3 nope | [512, 528) 4 fp32 scales | [528, 656) 64 bf16 rope",
    encode=_same,
    decode=_same,
)

#: CANN's row for npu_kv_quant_sparse_flash_attention with float8_e4m3fn keys (Ascend 950)
ASCEND_FP8_KV = KVCacheFormat(
    name="ascend-fp8-kv-nope-rope-scales",
    row="[0, 512) e4m3 nope | [512, 640) 64 bf16 rope | [640, 656) 4 fp32 scales",
    encode=flashmla_kv_to_ascend,
    decode=ascend_kv_to_flashmla,
)

#: Atlas A2/A3's storage: the rows' exact values in bf16, dequantized once (1152 bytes per token). Their
#: bf16 MLA ops (npu_fused_infer_attention_score, npu_sparse_flash_attention) read it as a bf16 cache;
#: the int8 nope their KV-quant op takes cannot carry e4m3 (module docstring)
ASCEND_BF16_KV = KVCacheFormat(
    name="ascend-bf16-kv-values-nope-rope",
    row="[0, 512) bf16 nope = e4m3 x scale (exact) | [512, 576) 64 bf16 rope (bf16 [..., 576], 1152 bytes)",
    encode=flashmla_kv_to_bf16_values,
    decode=bf16_values_to_flashmla_kv,
    dtype=torch.bfloat16,
    width=KV_HEAD_DIM,
)
