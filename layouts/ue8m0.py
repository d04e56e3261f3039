"""UE8M0: a scale stored as its fp32 exponent byte only (value 2^(e - 127)).

Rule: UE8M0 can carry only positive power-of-two scales. Converting any other fp32 scale would
change the math, so `ue8m0_exponents` refuses it; `ceil_to_ue8m0` is the explicit, documented way
to round scales up to powers of two *before* quantizing data with them.
"""

from __future__ import annotations

import torch

from ._util import require_dtype
from .errors import LayoutConversionError

__all__ = ["is_power_of_two", "ceil_to_ue8m0", "ue8m0_exponents", "ue8m0_to_fp32"]

_MANTISSA_MASK = 0x007FFFFF
_ABS_MASK = 0x7FFFFFFF
_EXP_MIN = 1  # exponent byte 0 is zero / subnormal in fp32
_EXP_MAX = 254  # exponent byte 255 is inf / NaN in fp32
_E8M0_NAN = 255
_FP32_NAN_BITS = 0x7FC00000
_FP32_TWO_POW_MINUS_127_BITS = 0x00400000  # subnormal 2^-127 (e8m0 byte 0)

_NOT_POW2_FIX = "scales are not powers of two; quantize with use_ue8m0=True / ceil_to_ue8m0 first"


def _fp32_bits(name: str, sf: torch.Tensor) -> torch.Tensor:
    require_dtype(name, sf, (torch.float32,), "pass fp32 scales (sf.float() is exact for bf16/fp16)")
    return sf.view(torch.int32)


def _pow2_exponents(sf: torch.Tensor) -> torch.Tensor | None:
    """int32 exponent of every element if all are positive normal powers of two, else None.

    Checked with two min/max reductions instead of boolean tensors (faster on CPU): the mantissa
    bits must all be 0 and the arithmetic-shifted exponent (negative when the sign bit is set) must
    lie in [1, 254].
    """
    bits = _fp32_bits("sf", sf)
    exponent = bits >> 23
    if bits.numel() == 0:
        return exponent
    if int((bits & _MANTISSA_MASK).amax()) != 0:
        return None
    low, high = torch.aminmax(exponent)
    if int(low) < _EXP_MIN or int(high) > _EXP_MAX:
        return None
    return exponent


def is_power_of_two(sf: torch.Tensor) -> bool:
    """True when every element of the fp32 tensor `sf` is a positive, finite, normal power of two.

    In fp32 bits: `bits & 0x807fffff == 0` (sign 0, mantissa 0) and exponent byte `bits >> 23` in
    [1, 254] (not zero/subnormal, not inf/NaN). An empty tensor is True.

    >>> is_power_of_two(torch.tensor([1.0, 0.5, 2.0 ** -126, 2.0 ** 127]))
    True
    >>> [is_power_of_two(torch.tensor([v])) for v in (1.5, -2.0, 0.0)]
    [False, False, False]
    """
    return _pow2_exponents(sf) is not None


def checked_exponents_int32(sf: torch.Tensor) -> torch.Tensor:
    """int32 exponents of power-of-two fp32 scales (for packers that narrow while copying); raises otherwise."""
    exponent = _pow2_exponents(sf)
    if exponent is None:
        raise LayoutConversionError(f"cannot store fp32 scales as UE8M0 exponents: {_NOT_POW2_FIX}")
    return exponent


def ceil_to_ue8m0(sf: torch.Tensor) -> torch.Tensor:
    """Round fp32 scales up to the next power of two: returns fp32 2^(e - 127).

    Rule (FORMATS.md): `e` is the biased exponent of `sf`, plus one if the mantissa is non-zero,
    clamped to [1, 254]. Consequences, all deliberate:

    - a power of two is returned unchanged (1.0 -> 1.0); 1.5 -> 2.0; 0.3 -> 0.5;
    - zero and subnormals become 2^-126 (the clamp at e = 1), the smallest normal fp32;
    - values above 2^127 (mantissa non-zero at e = 254) clamp to 2^127 — the only case where the
      result is below the input; scales that large do not occur in practice.

    Negative, infinite and NaN scales are refused with LayoutConversionError (a scale is a positive
    finite number; -0.0 is treated as 0.0).
    """
    bits = _fp32_bits("sf", sf)
    magnitude = bits & _ABS_MASK
    if bool(((bits < 0) & (magnitude != 0)).any()):
        raise LayoutConversionError("ceil_to_ue8m0: scales must be >= 0, got negative values; pass amax-based scales")
    exponent = magnitude >> 23
    if bool((exponent == 255).any()):
        raise LayoutConversionError("ceil_to_ue8m0: scales contain inf or NaN; clamp amax before computing scales")
    exponent = exponent + ((magnitude & _MANTISSA_MASK) != 0).to(torch.int32)
    exponent = exponent.clamp_(_EXP_MIN, _EXP_MAX)
    return (exponent << 23).view(torch.float32)


def ue8m0_exponents(sf: torch.Tensor) -> torch.Tensor:
    """Exponent bytes (uint8, same shape) of power-of-two fp32 scales: `e = bits >> 23`, sf = 2^(e - 127).

    Raises LayoutConversionError if any scale is not a positive finite power of two, because storing
    only the exponent would silently change it. Example: [1.0, 2.0, 0.5, 2^-126] -> [127, 128, 126, 1].
    """
    return checked_exponents_int32(sf).to(torch.uint8)


def ue8m0_to_fp32(e: torch.Tensor) -> torch.Tensor:
    """fp32 value of UE8M0 exponent bytes: 2^(e - 127), identical to `e.view(torch.float8_e8m0fnu).float()`.

    e in [1, 254] gives normal fp32 (bits `e << 23`); e = 0 gives the fp32 subnormal 2^-127 and
    e = 255 gives NaN, as in the OCP E8M0 definition. Encoders in this package never produce 0 or 255.
    """
    require_dtype("e", e, (torch.uint8,), "pass the uint8 exponent bytes")
    e32 = e.to(torch.int32)
    bits = e32 << 23
    bits = torch.where(e32 == 0, _FP32_TWO_POW_MINUS_127_BITS, bits)
    bits = torch.where(e32 == _E8M0_NAN, _FP32_NAN_BITS, bits)
    return bits.view(torch.float32)
