"""`Layout`: how a backend declares the bytes it wants for a quantized argument, and the one
function that converts a QuantTensor into those bytes (`encode_for`).

Conversions happen here and in prepare_inputs only; providers never convert.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import torch

from .errors import LayoutError
from .layouts.errors import LayoutConversionError
from .layouts.ue8m0 import is_power_of_two
from .tensors import LayoutTag, PreparedTensor, QuantTensor

EncodeFn = Callable[[QuantTensor], "tuple[torch.Tensor, torch.Tensor | None, tuple[int, int]]"]
DecodeFn = Callable[[PreparedTensor], QuantTensor]


@attrs.frozen
class Layout:
    """One byte format a backend wants for one argument.

    format:   the format's name, e.g. "sm100-ue8m0-int32-mn-major-tma"
    encode:   QuantTensor -> (data bytes, scale storage, granularity the storage carries)
    decode:   PreparedTensor -> QuantTensor with the same numbers (the oracle's way back)
    requires_ue8m0: the format stores exponents only, so scales must be powers of two
    params:   extra tag parameters (e.g. (("arch", "sm100"),))
    """

    format: str
    encode: EncodeFn
    decode: DecodeFn
    requires_ue8m0: bool = False
    params: tuple[tuple[str, Any], ...] = ()


def encode_for(op: str, arg: str, backend: str, layout: Layout, qt: QuantTensor) -> PreparedTensor:
    """Convert `qt` into `layout`'s bytes; refuse conversions that would change the math."""
    if layout.requires_ue8m0 and not (qt.ue8m0 or is_power_of_two(qt.scale)):
        raise LayoutError(
            f"{op}: argument '{arg}' has scales that are not powers of two, but backend {backend!r} stores "
            f"them as UE8M0 exponents ({layout.format}); converting would change the math. Fix: quantize with "
            f"use_ue8m0=True (e.g. per_token_cast_to_fp8(x, use_ue8m0=True)) so every scale is a power of two.")
    try:
        data, scale, granularity = layout.encode(qt)
    except LayoutConversionError as exc:
        raise LayoutError(f"{op}: argument '{arg}' cannot be stored as {backend}:{layout.format}: {exc}") from exc
    tag = LayoutTag(backend, layout.format, layout.params + (("granularity", granularity),))
    return PreparedTensor(data=data, scale=scale, tag=tag, shape=tuple(qt.shape), granularity=qt.granularity,
                          ue8m0=qt.ue8m0 or layout.requires_ue8m0, element=qt.element)


#: the logical layout's name: data as is, fp32 scales row-major and contiguous
PLAIN_FORMAT = "fp32-row-major"


def plain_layout(backend: str) -> Layout:
    """Data and fp32 scales exactly as the QuantTensor holds them (row-major, contiguous)."""
    def encode(qt: QuantTensor):
        return qt.data.contiguous(), qt.scale.contiguous(), qt.granularity

    def decode(p: PreparedTensor) -> QuantTensor:
        return QuantTensor(p.data, p.scale, p.storage_granularity, p.ue8m0, p.element)

    return Layout(PLAIN_FORMAT, encode, decode)
