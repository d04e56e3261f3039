"""`Format`: one small frozen value per byte format of a quantized operand, and the table of them.

A Format names a byte layout (data bytes + scale storage), says what it holds (elements, scale
storage, granularity rule, whether scales must be powers of two) and converts both ways: `encode`
takes the logical form (data as quantized, fp32 row-major scales) to the chip's bytes, `decode`
brings them back, bit for bit. Every Format is defined once, next to the layout functions it
composes (`PLAIN` here, the NVIDIA ones in `nvidia.py`, the Ascend ones in `ascend.py`), and is
registered by name so a pickled operand finds its Format again. Rule: torch and stdlib only.

Operands are passed duck-typed: `encode` reads `.data`, `.scale`, `.granularity`, `.shape`,
`.element` of a logical operand; `decode` reads `.data`, `.scale`, `.storage_granularity`,
`.shape`, `.element` of a stored one.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, NamedTuple

import torch

#: element types a Format can hold: fp8 e4m3 bytes, or E2M1 codes packed two per byte along K
ELEMENTS = ("e4m3", "e2m1")


class Encoded(NamedTuple):
    """What `Format.encode` returns: stored data, stored scales, granularity the storage carries."""

    data: torch.Tensor
    scale: torch.Tensor | None
    storage_granularity: tuple[int, int]


class Decoded(NamedTuple):
    """What `Format.decode` returns: data as quantized (ND, K-major), fp32 row-major scales, and
    their granularity (the plain form every reference reads)."""

    data: torch.Tensor
    scale: torch.Tensor
    granularity: tuple[int, int]


@dataclasses.dataclass(frozen=True, eq=False)
class Format:
    """One byte format. Compared by identity: there is exactly one object per name.

    name:          unique, e.g. "sm100-ue8m0-int32-mn-major-tma"
    elements:      element types it can hold ("e4m3", "e2m1")
    scale_storage: the scale bytes in words, e.g. "int32 [MN, ceil(sf_k/4)], strides (1, align(MN, 4))"
    granularity:   the granularity rule in words, e.g. "per row (1, gran_k); 128x128 blocks broadcast along N"
    requires_pow2: scales are stored as exponents only, so they must be powers of two
    encode:        logical operand -> Encoded
    decode:        stored operand -> Decoded
    storage_granularity: the granularity the storage carries for a logical granularity
    data_layout:   the data bytes in words ("ND, K contiguous" unless said otherwise)
    validate:      optional: a stored operand -> None, or why its data/scale do not fit this format
                   (shapes, dtypes, strides; never values), run on hand-built and unpickled operands
    """

    name: str
    elements: tuple[str, ...]
    scale_storage: str
    granularity: str
    requires_pow2: bool
    encode: Callable[[Any], Encoded] = dataclasses.field(repr=False)
    decode: Callable[[Any], Decoded] = dataclasses.field(repr=False)
    storage_granularity: Callable[[tuple[int, int]], tuple[int, int]] = dataclasses.field(repr=False)
    data_layout: str = "ND, K contiguous"
    validate: Callable[[Any], str | None] | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"a Format needs a non-empty name, got {self.name!r}")
        unknown = [e for e in self.elements if e not in ELEMENTS]
        if unknown or not self.elements:
            raise ValueError(f"Format {self.name!r}: elements {self.elements!r} must be a non-empty subset of {ELEMENTS}")
        _register(self)

    def describe(self) -> str:
        """Several lines for docs, errors and `doctor`."""
        pow2 = "power-of-two scales only" if self.requires_pow2 else "any fp32 scale"
        return (f"{self.name}: data {self.data_layout} ({'/'.join(self.elements)}); scales {self.scale_storage}; "
                f"granularity {self.granularity}; {pow2}")

    def __str__(self) -> str:
        return self.name

    def check(self, operand: Any) -> str | None:
        """None when `operand`'s data and scale fit this format (shapes, dtypes, strides), else why not."""
        return None if self.validate is None else self.validate(operand)

    def __reduce__(self) -> tuple[Callable[[str], Format], tuple[str]]:
        return format_named, (self.name,)


_LOCK = threading.Lock()
_FORMATS: dict[str, Format] = {}


def _register(fmt: Format) -> None:
    with _LOCK:
        if fmt.name in _FORMATS:
            raise ValueError(f"a Format named {fmt.name!r} is already defined; give a new byte format a new name")
        _FORMATS[fmt.name] = fmt


def format_named(name: str) -> Format:
    """The Format registered under `name`; KeyError (listing the known names) if there is none."""
    try:
        return _FORMATS[name]
    except KeyError:
        known = ", ".join(sorted(_FORMATS)) or "none"
        raise KeyError(f"no byte format named {name!r} is defined (known formats: {known}); import the "
                       f"package that defines it (a backend plugin) first") from None


def known_formats() -> dict[str, Format]:
    """Every defined Format, by name."""
    return dict(_FORMATS)


# ---------------------------------------------------------------------------------------------
# shape checks shared by the formats' validators

#: the data dtype of each element type (packed E2M1 may also come as int8, DeepGEMM's choice)
ELEMENT_DTYPES = {"e4m3": (torch.float8_e4m3fn,), "e2m1": (torch.uint8, torch.int8)}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def stored_columns(operand: Any) -> int:
    """Columns of the ND data: K, or K/2 for packed E2M1."""
    k = operand.shape[-1]
    return k // 2 if operand.element == "e2m1" else k


def nd_data_problem(operand: Any) -> str | None:
    """Why `operand.data` is not ND [..., MN, K] (K/2 bytes for e2m1) of its element's dtype, or None."""
    data = operand.data
    if data.dtype not in ELEMENT_DTYPES[operand.element]:
        return f"data is {data.dtype}, not the {operand.element} dtype {ELEMENT_DTYPES[operand.element][0]}"
    want = (*operand.shape[:-1], stored_columns(operand))
    if tuple(data.shape) != want:
        return f"data has shape {tuple(data.shape)}, expected {want} for logical shape {tuple(operand.shape)}"
    return None


def scale_problem(operand: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> str | None:
    """Why `operand.scale` is not a `dtype` tensor of `shape`, or None."""
    scale = operand.scale
    if not isinstance(scale, torch.Tensor) or scale.dtype != dtype:
        return f"scale is {getattr(scale, 'dtype', type(scale).__name__)}, expected {dtype}"
    if tuple(scale.shape) != tuple(shape):
        return f"scale has shape {tuple(scale.shape)}, expected {tuple(shape)}"
    return None


def block_scale_shape(operand: Any) -> tuple[int, ...]:
    """[..., ceil(MN/gm), ceil(K/gk)] for the storage granularity (gm, gk)."""
    gm, gk = operand.storage_granularity
    return (*operand.shape[:-2], ceil_div(operand.shape[-2], gm), ceil_div(operand.shape[-1], gk))


# ---------------------------------------------------------------------------------------------
# PLAIN: the logical form itself


def _plain_encode(operand: Any) -> Encoded:
    return Encoded(operand.data.contiguous(), operand.scale.contiguous(), tuple(operand.granularity))


def _plain_decode(operand: Any) -> Decoded:
    return Decoded(operand.data, operand.scale, tuple(operand.storage_granularity))


def _same_granularity(granularity: tuple[int, int]) -> tuple[int, int]:
    return tuple(granularity)


def _plain_validate(operand: Any) -> str | None:
    problem = nd_data_problem(operand) or scale_problem(operand, torch.float32, block_scale_shape(operand))
    if problem is None and not operand.scale.is_contiguous():
        problem = f"scale has strides {operand.scale.stride()}, expected row-major contiguous"
    return problem


#: data as quantized and fp32 scales row-major `[..., ceil(MN/gran_mn), ceil(K/gran_k)]`, contiguous —
#: what the references read, and the default Format of a backend that declares none
PLAIN = Format(
    name="fp32-row-major",
    elements=ELEMENTS,
    scale_storage="fp32 [..., ceil(MN/gran_mn), ceil(K/gran_k)], row-major, contiguous",
    granularity="as quantized (any block shape)",
    requires_pow2=False,
    encode=_plain_encode,
    decode=_plain_decode,
    storage_granularity=_same_granularity,
    validate=_plain_validate,
)
