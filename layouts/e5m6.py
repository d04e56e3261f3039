"""E5M6: TileKernels' 12-bit float (1 sign, 5 exponent, 6 mantissa bits, bias 15), eight codes
packed into three little-endian uint32 words (12 bytes).

Rule: a code is the top 12 bits of an IEEE fp16, so decoding is exact (`code << 4` read as fp16);
encoding follows TileKernels' own rule bit for bit, including its quirks (below).

Values: max finite 0x7BF = 2^15 · (1 + 63/64) = 65024; min normal 0x040 = 2^-14; subnormals
0x001..0x03F = k · 2^-20; 0x7C0 is inf, 0x7C1..0x7FF NaN; the sign is bit 11 (0x800 is -0).

Encode (fp32 x -> code), TileKernels' `float_to_e5m6`:
1. h = fp16 bits of x rounded toward zero: exponent 113..142 (|x| in [2^-14, 2^16)) normal;
   103..112 fp16 subnormal (mantissa with its implicit bit shifted right, truncated); below that
   ±0; 143..254 and inf -> ±inf (0x7C00); NaN -> sign | 0x7FFF.
2. code = h >> 4, plus one when (code & 1) + (bits(x) & 0x1FFFF) > 0x10000 — round to nearest,
   ties to even, judged on the low 17 bits of the fp32 mantissa; the carry may move into the
   exponent (65280 -> inf). Kept as TileKernels has it: for fp16 subnormals the judged bits are
   not the dropped ones, an overflow code 0x7C0 may step to 0x7C1 (a NaN), and a NaN whose low
   17 bits exceed 0x10000 wraps to 0x800 (-0). Casts never reach these: their values are scaled
   into ±65024 (NaN only through a NaN or inf input).
3. code &= 0xFFF.

Packing, per group of eight codes h0..h7 along the contiguous axis (K % 8 == 0)::

    w0 = h0 << 20 | h1 << 8 | h2 >> 4
    w1 = (h2 & 0xF) << 28 | h3 << 16 | h4 << 4 | h5 >> 8
    w2 = (h5 & 0xFF) << 24 | h6 << 12 | h7          bytes: w0, w1, w2 each little-endian

Example: [1.0, -2.0, 65024, 2^-20, 0.0, -0.0, 0.5, 3.0] -> codes
[0x3C0, 0xC00, 0x7BF, 0x001, 0x000, 0x800, 0x380, 0x420] -> w0 = 0x3C0C007B, w1 = 0xF0010008,
w2 = 0x00380420 -> bytes 7B 00 0C 3C | 08 00 01 F0 | 20 04 38 00.
"""

from __future__ import annotations

import torch

from ._util import require_dtype
from .errors import LayoutConversionError

__all__ = ["E5M6_MAX", "E5M6_GROUP", "E5M6_GROUP_BYTES", "e5m6_encode", "e5m6_decode", "pack_e5m6", "unpack_e5m6"]

#: the largest finite E5M6 value, 2^15 · (1 + 63/64)
E5M6_MAX = 65024.0
#: codes per packed group, and the group's bytes (three uint32 words)
E5M6_GROUP = 8
E5M6_GROUP_BYTES = 12

_FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


def _require_codes(codes: object) -> None:
    if not isinstance(codes, torch.Tensor) or codes.is_floating_point() or codes.is_complex() \
            or codes.dtype == torch.bool:
        require_dtype("codes", codes, (torch.int32,), "pass integer E5M6 codes (e.g. from unpack_e5m6)")


def _fp16_bits_toward_zero(bits: torch.Tensor) -> torch.Tensor:
    """int32 fp16 bits (0..0xFFFF) of fp32 bits, rounded toward zero, overflow to inf (step 1)."""
    sign = (bits >> 16) & 0x8000
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    normal = sign | ((exp - 112) << 10) | (mant >> 13)
    # exp 103..112: shift 23..14 bits out of the 24-bit significand; clamp the shift for the others
    sub = sign | ((mant | 0x800000) >> (126 - exp).clamp(0, 31))
    out = torch.where(exp >= 113, normal, torch.where(exp >= 103, sub, sign))
    out = torch.where(exp >= 143, sign | 0x7C00, out)
    return torch.where((exp == 255) & (mant != 0), sign | 0x7FFF, out)


def e5m6_encode(x: torch.Tensor) -> torch.Tensor:
    """E5M6 codes (int32 0..0xFFF, same shape) of a float tensor by TileKernels' rule (module docstring).

    bf16 / fp16 inputs are widened to fp32 first (exact)."""
    require_dtype("x", x, _FLOAT_INPUTS, "pass fp32, bf16 or fp16 values")
    bits = x.float().contiguous().view(torch.int32)
    code = _fp16_bits_toward_zero(bits) >> 4
    code = code + (((code & 1) + (bits & 0x1FFFF)) > 0x10000).to(torch.int32)
    return code & 0xFFF


def e5m6_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of E5M6 codes (any integer dtype; the low 12 bits are read): `code << 4` as fp16."""
    _require_codes(codes)
    half = ((codes.to(torch.int32) & 0xFFF) << 4).to(torch.int16)  # bits 0x8000.. wrap to negative int16
    return half.view(torch.float16).float()


def pack_e5m6(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K * 3 / 2] of int codes [..., K] (K % 8 == 0): eight codes per 12 bytes (module docstring)."""
    _require_codes(codes)
    if codes.dim() == 0 or codes.shape[-1] % E5M6_GROUP:
        raise LayoutConversionError(f"codes has shape {tuple(codes.shape)}; pack_e5m6 needs [..., K] with K a "
                                    "multiple of 8 (eight codes per 12 bytes); pad K")
    *lead, k = codes.shape
    h = (codes.to(torch.int64) & 0xFFF).view(*lead, k // E5M6_GROUP, E5M6_GROUP).unbind(-1)
    words = ((h[0] << 20) | (h[1] << 8) | (h[2] >> 4),
             ((h[2] & 0xF) << 28) | (h[3] << 16) | (h[4] << 4) | (h[5] >> 8),
             ((h[5] & 0xFF) << 24) | (h[6] << 12) | h[7])
    out = torch.stack([(w >> s) & 0xFF for w in words for s in (0, 8, 16, 24)], dim=-1)
    return out.to(torch.uint8).view(*lead, k // E5M6_GROUP * E5M6_GROUP_BYTES)


def unpack_e5m6(data: torch.Tensor) -> torch.Tensor:
    """int32 codes [..., K] of packed bytes [..., K * 3 / 2] (uint8; last dim a multiple of 12)."""
    require_dtype("data", data, (torch.uint8,), "pass the uint8 bytes a cast to e5m6 returned")
    if data.dim() == 0 or data.shape[-1] % E5M6_GROUP_BYTES:
        raise LayoutConversionError(f"data has shape {tuple(data.shape)}; unpack_e5m6 needs bytes [..., K * 3 / 2] "
                                    "with K a multiple of 8 (a multiple of 12 bytes)")
    *lead, n = data.shape
    b = data.to(torch.int64).view(*lead, n // E5M6_GROUP_BYTES, 3, 4)
    w = (b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)).unbind(-1)
    h = (w[0] >> 20, (w[0] >> 8) & 0xFFF, ((w[0] & 0xFF) << 4) | (w[1] >> 28), (w[1] >> 16) & 0xFFF,
         (w[1] >> 4) & 0xFFF, ((w[1] & 0xF) << 8) | (w[2] >> 24), (w[2] >> 12) & 0xFFF, w[2] & 0xFFF)
    return torch.stack(h, dim=-1).to(torch.int32).view(*lead, n // E5M6_GROUP_BYTES * E5M6_GROUP)
