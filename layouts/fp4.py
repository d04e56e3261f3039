"""FP4 E2M1: one sign bit and a 3-bit magnitude index, packed two codes per byte.

Rule: codes are exact 4-bit patterns; packing never reinterprets them. torch cannot convert
`float4_e2m1fn_x2`, so codes are built and packed here by hand.

Code layout (bit 3 = sign, bits 0-2 = magnitude index)::

    index      0    1    2    3    4    5    6    7
    magnitude  0    0.5  1    1.5  2    3    4    6

Packing along the contiguous axis, even element in the LOW nibble: `byte = c[2i] | c[2i+1] << 4`.
Example: values [1.0, -0.5, 6.0, 0.0] -> codes [0x2, 0x9, 0x7, 0x0] -> bytes [0x92, 0x07].

Scales: UE8M0 per 32 (or 128) elements along K, `sf = ceil_to_ue8m0(amax / 6)`, packed with the
FP8 scale packers (`sm100_ue8m0_encode` four per int32, `ascend_mx_encode` two per int16).
"""

from __future__ import annotations

import torch

from ._util import require_dtype
from .constants import FP4_E2M1_MAX
from .errors import LayoutConversionError
from .ue8m0 import ceil_to_ue8m0

__all__ = [
    "E2M1_VALUES",
    "e2m1_encode",
    "e2m1_encode_ties_toward_zero",
    "e2m1_decode",
    "pack_e2m1",
    "unpack_e2m1",
    "fp4_scale_from_amax",
]

# Value of each 4-bit code 0..15 (codes 8..15 are the negatives; 8 is -0.0).
E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                  -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # fmt: skip
_FLOAT_INPUTS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 0..15, same shape) of a float tensor: round to nearest, ties to the even code.

    |x| > 6 saturates to 6 (code 7). The sign bit (bit 3) follows the sign of x, so -0.0 and small
    negatives that round to zero give code 0x8 (negative zero). Ties: 0.25 -> 0, 0.75 -> 1.0,
    1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0. NaN or inf raises
    LayoutConversionError (E2M1 has neither; clamp or scale before encoding).
    """
    require_dtype("x", x, _FLOAT_INPUTS, "pass a floating tensor (fp32, fp64, bf16, fp16)")
    mag = x.abs() if x.dtype in (torch.float32, torch.float64) else x.float().abs_()  # bf16/fp16 -> fp32 exact
    top = mag.amax() if mag.numel() else mag.new_zeros(())
    if not bool(torch.isfinite(top)):  # NaN propagates through amax, inf is the max
        raise LayoutConversionError("e2m1_encode: input contains NaN or inf; E2M1 cannot carry them")
    mag.clamp_(max=FP4_E2M1_MAX)
    codes = _magnitude_index_fp64(mag) if mag.dtype == torch.float64 else _magnitude_index_fp32(mag)
    return codes.add_(torch.signbit(x).view(torch.uint8), alpha=8)  # sign in bit 3


def _magnitude_index_fp32(mag: torch.Tensor) -> torch.Tensor:
    """Index 0..7 of |x| in [0, 6] (fp32, consumed), nearest with ties to even, by fp32 bit arithmetic.

    For |x| >= 1 the index is the fp32 exponent and the top mantissa bit, (e << 1 | m) - 252, after
    rounding the mantissa to one bit (add 2^21 - 1 plus the kept bit, so ties go to an even m; a
    carry moves into the exponent: 1.75 -> 2.0). Below 1 the grid is 0, 0.5, 1: adding 2^23 to 2|x|
    lets the FPU round it to an integer, half to even (0.25 -> 0, 0.75 -> 1.0).
    """
    bits = mag.view(torch.int32)
    index = bits >> 22
    index &= 1
    index += bits
    index += 0x1FFFFF
    index >>= 22
    index -= 252
    below_one = mag < 1.0
    mag.mul_(2.0).add_(8388608.0)  # 2^23: the FPU rounds 2|x| to an integer
    small = mag.view(torch.int32)
    small -= 0x4B000000  # bits of 2^23
    return torch.where(below_one, small, index, out=index).to(torch.uint8)


def _magnitude_index_fp64(mag: torch.Tensor) -> torch.Tensor:
    """fp64 inputs, kept in fp64 so no double rounding: the grid step is 0.5 on [0, 2), 1 on [2, 4),
    2 on [4, 6], and torch.round rounds half to even, which is "ties to the even index" because
    every range starts at an even index (0, 4, 6)."""
    index = torch.where(
        mag < 2.0,
        torch.round(mag * 2.0),
        torch.where(mag < 4.0, torch.round(mag) + 2.0, torch.round(mag * 0.5) + 4.0),
    )
    return index.to(torch.uint8)


#: the midpoints between neighbouring E2M1 magnitudes
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def e2m1_encode_ties_toward_zero(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 0..15) by DeepGEMM's rule: the magnitude index is the number of midpoints
    (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0) that |x| exceeds, so every tie rounds toward zero
    (0.75 -> 0.5, 1.75 -> 1.5, 3.5 -> 3.0, also 0.25 -> 0, 1.25 -> 1.0, 2.5 -> 2.0, 5.0 -> 4.0),
    |x| > 5 gives 6; the sign bit is set only for a non-zero magnitude, so -0.0 and small negatives
    give code 0x0 (+0). `e2m1_encode` is the other rule (ties to even, sign kept). NaN or inf raises
    LayoutConversionError.

    Example: [0.75, -0.1, 1.75, -3.5, 7.0] -> [0x1, 0x0, 0x3, 0xD, 0x7].
    """
    require_dtype("x", x, _FLOAT_INPUTS, "pass a floating tensor (fp32, fp64, bf16, fp16)")
    mag = x.abs() if x.dtype in (torch.float32, torch.float64) else x.float().abs_()
    top = mag.amax() if mag.numel() else mag.new_zeros(())
    if not bool(torch.isfinite(top)):
        raise LayoutConversionError("e2m1_encode_ties_toward_zero: input contains NaN or inf; E2M1 cannot carry them")
    midpoints = torch.tensor(_E2M1_MIDPOINTS, dtype=mag.dtype, device=mag.device)
    index = torch.bucketize(mag, midpoints, right=False).to(torch.uint8)  # midpoints strictly below |x|
    negative = (x < 0) & (index != 0)
    return index.add_(negative.view(torch.uint8), alpha=8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of E2M1 codes (uint8 0..15). Code 0x8 decodes to -0.0."""
    _check_codes(codes)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def _check_codes(codes: torch.Tensor) -> None:
    require_dtype("codes", codes, (torch.uint8,), "pass uint8 codes from e2m1_encode")
    if codes.numel() and int(codes.max()) > 0xF:
        raise LayoutConversionError("codes must be 4-bit values 0..15; pass codes from e2m1_encode")


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes `[..., K]` into uint8 `[..., K/2]`: `byte = c[2i] | c[2i+1] << 4`.

    K must be even (LayoutConversionError otherwise: pad K to an even length first).
    Example: codes [0x2, 0x9, 0x7, 0x0] -> bytes [0x92, 0x07].
    """
    _check_codes(codes)
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise LayoutConversionError(
            f"pack_e2m1: last dim must be even to pack two codes per byte, got shape {tuple(codes.shape)}; "
            "pad K to an even length first"
        )
    # Little-endian, a pair (c0, c1) read as one int16 is c0 + 256*c1; OR-ing in its shift by 4
    # puts c1 in the high nibble of the low byte (c0 < 16, so nothing else lands there), and
    # narrowing each int16 to uint8 keeps that low byte. Shifting four pairs at once as one int64
    # gives the same int16 halves (a nibble crossing into the next pair lands in its high byte).
    if codes.numel() == 0:
        return torch.empty((*codes.shape[:-1], codes.shape[-1] // 2), dtype=torch.uint8, device=codes.device)
    codes = codes.contiguous()
    wide = torch.int64 if codes.shape[-1] % 8 == 0 else torch.int16
    words = codes.view(wide)
    mixed = words >> 4
    mixed |= words
    return mixed.view(torch.int16).to(torch.uint8)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_e2m1`: uint8 (or int8) `[..., K/2]` -> uint8 codes `[..., K]`, low nibble first."""
    require_dtype("packed", packed, (torch.uint8, torch.int8), "pass the bytes returned by pack_e2m1")
    if packed.dim() == 0:
        raise LayoutConversionError("packed must have at least one dim [..., K/2]")
    p = packed.view(torch.uint8)
    return torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)


def fp4_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """UE8M0-ready FP4 block scale: `ceil_to_ue8m0(amax / 6)`, so |x / sf| <= 6.

    amax 6 -> 1.0, amax 7 -> 2.0, amax 0 -> 2^-126 (ceil_to_ue8m0 clamps the exponent at 1).
    """
    require_dtype("amax", amax, (torch.float32,), "compute amax in fp32")
    return ceil_to_ue8m0(amax / FP4_E2M1_MAX)
