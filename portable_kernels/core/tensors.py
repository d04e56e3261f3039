"""Value types for quantized operands: the logical `QuantTensor` and a backend's `PreparedTensor`.

A QuantTensor holds numbers (fp8 data and plain row-major fp32 scales); a PreparedTensor holds the
same numbers in one backend's bytes, tagged with that layout. Neither converts anything by itself.
"""

from __future__ import annotations

from typing import Any, Iterator

import attrs
import torch

from .errors import ContractError, LayoutError
from ..layouts.format import ELEMENTS, Format, format_named, known_formats

FP8_DTYPE = torch.float8_e4m3fn

#: element formats a QuantTensor can carry; "e2m1" data is packed two codes per byte along K.
ELEMENT_FORMATS = ELEMENTS
_ELEMENT_DTYPES = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.uint8}


def describe(x: object) -> str:
    """A short human description of a value for error messages."""
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    if isinstance(x, (QuantTensor, PreparedTensor)):
        return repr(x)
    if isinstance(x, tuple):
        return "a tuple (" + ", ".join(describe(v) for v in x) + ")"
    return f"{type(x).__name__} {x!r}"


@attrs.frozen
class LayoutTag:
    """A prepared operand's readable name: which backend reads it, its Format's name, its options.

    For printing and messages only; the PreparedTensor holds the Format itself.
    """

    backend: str
    format: str
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    def __str__(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.backend}:{self.format}" + (f"({extra})" if extra else "")


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


@attrs.frozen(eq=False, repr=False)
class QuantTensor:
    """A block-quantized tensor in logical form.

    data:  fp8 e4m3 [..., MN, K] (or, for element "e2m1", uint8 [..., MN, K/2] two codes per byte)
    scale: fp32 [..., ceil(MN/gran_mn), ceil(K/gran_k)], row-major; value = data * scale of its block
    granularity: (gran_mn, gran_k), e.g. (1, 128) for activations, (128, 128) for weights
    ue8m0: True when every scale is known to be a power of two (quantized with use_ue8m0); False
           means not known, and a Format that stores exponents only checks the values when converting

    Behaves like the `(data, scale)` pair it stands for — unpacking, `q[0]`, `q[1]`, `len(q) == 2` —
    so it can be passed and indexed wherever DeepGEMM takes or returns a tuple.
    """

    data: torch.Tensor
    scale: torch.Tensor
    granularity: tuple[int, int]
    ue8m0: bool = False
    element: str = "e4m3"
    #: what run-time selection keys on (an unprepared operand is converted in the call)
    signature: tuple = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        data, scale, element = self.data, self.scale, self.element
        want = _ELEMENT_DTYPES.get(element)
        if want is None:
            raise ContractError(f"QuantTensor: element {element!r} is unknown; use one of {ELEMENT_FORMATS}.")
        if not isinstance(data, torch.Tensor) or data.dtype != want:
            raise ContractError(f"QuantTensor: data is {describe(data)}; expected {want} for element "
                                f"{element!r}. Fix: quantize with per_token_cast_to_fp8 / per_block_cast_to_fp8.")
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
            raise ContractError(f"QuantTensor: scale is {describe(scale)}; expected float32 scales.")
        shape = data.shape
        if len(shape) < 2:
            raise ContractError(f"QuantTensor: data has {data.dim()} dims; expected at least 2 ([MN, K]).")
        gm, gk = self.granularity
        if gm < 1 or gk < 1:
            raise ContractError(f"QuantTensor: granularity {self.granularity} must be positive.")
        k = shape[-1] * 2 if element == "e2m1" else shape[-1]
        have = scale.shape
        if len(have) != len(shape) or have[-2] != -(-shape[-2] // gm) or have[-1] != -(-k // gk) \
                or have[:-2] != shape[:-2]:
            expect = self.scale_shape_for(tuple(self.shape), (gm, gk))
            raise ContractError(f"QuantTensor: scale has shape {tuple(have)}; expected {expect} for data "
                                f"of logical shape {tuple(self.shape)} and granularity {self.granularity}.")
        device = data.device
        if scale.device != device:
            raise ContractError(f"QuantTensor: scale is on {scale.device} but data on {device}.")
        object.__setattr__(self, "granularity", (int(gm), int(gk)))
        object.__setattr__(self, "signature", ("quant", self.granularity, self.ue8m0, element, device))

    @classmethod
    def unchecked(cls, data: torch.Tensor, scale: torch.Tensor, granularity: tuple[int, int], ue8m0: bool,
                  element: str) -> "QuantTensor":
        """A QuantTensor without the constructor's checks, for values the library has just checked
        or produced (a raw tuple's validated parts; a quantizer provider's outputs, which
        conformance checks against the references): the hot path of activations."""
        qt = object.__new__(cls)
        s = _QUANT_SLOTS  # the frozen class's slot setters
        s["data"](qt, data)
        s["scale"](qt, scale)
        s["granularity"](qt, granularity)
        s["ue8m0"](qt, ue8m0)
        s["element"](qt, element)
        s["signature"](qt, ("quant", granularity, ue8m0, element, data.device))
        return qt

    @staticmethod
    def scale_shape_for(shape: tuple[int, ...], granularity: tuple[int, int]) -> tuple[int, ...]:
        gm, gk = granularity
        return (*shape[:-2], cdiv(shape[-2], gm), cdiv(shape[-1], gk))

    @property
    def shape(self) -> torch.Size:
        """Logical element shape (K counts elements, also for packed e2m1)."""
        if self.element == "e2m1":
            return torch.Size((*self.data.shape[:-1], self.data.shape[-1] * 2))
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    def __iter__(self) -> Iterator[torch.Tensor]:
        yield self.data
        yield self.scale

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        return _pair_item(self, index)

    def __repr__(self) -> str:
        return (f"QuantTensor({self.element} {tuple(self.shape)}, scale {tuple(self.scale.shape)} fp32, "
                f"granularity={self.granularity}, ue8m0={self.ue8m0}, device={self.device})")


@attrs.frozen(eq=False, repr=False)
class PreparedTensor:
    """A quantized operand in one backend's native bytes: what prepare_inputs returns and what
    providers receive.

    data:   the element bytes as `format` stores them (fp8 e4m3, or E2M1 codes two per byte, maybe tiled)
    scale:  the format's scale storage (any dtype, shape and strides the format defines)
    format: the byte Format (portable_kernels.core.formats), one object per format
    backend: the backend that reads it; params: that backend's options it was prepared under
            (e.g. (("arch", "sm100"),))
    shape:  the logical element shape [..., MN, K] (K counts elements, also for packed e2m1)
    granularity: the math's block granularity (as quantized, e.g. (128, 128));
    storage_granularity: what the scale storage carries (e.g. (1, 128) once broadcast per row)
    ue8m0, element: as in the QuantTensor it came from

    `signature` (computed once) is what run-time selection keys on: backend, format, options,
    element, data dtype and device, granularities and ue8m0 (a few values each, never sizes).
    Like a QuantTensor it behaves as the pair `(data, scale)` of its stored bytes (`p[0]`, `p[1]`,
    unpacking, `len(p) == 2`): for nvidia sm100 that is DeepGEMM's own packed int32 scale tensor.
    """

    data: torch.Tensor
    scale: torch.Tensor | None
    format: Format
    backend: str
    shape: tuple[int, ...]
    granularity: tuple[int, int]
    storage_granularity: tuple[int, int]
    ue8m0: bool = False
    element: str = "e4m3"
    params: tuple[tuple[str, Any], ...] = ()
    signature: tuple = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # a hand-built or unpickled operand is checked against its Format (library code that has
        # just produced the bytes uses `unchecked`)
        _check_prepared(self)
        object.__setattr__(self, "signature", ("prepared", self.backend, self.format.name, self.params, self.element,
                                               self.data.dtype, self.data.device, self.granularity,
                                               self.storage_granularity, self.ue8m0))

    @classmethod
    def unchecked(cls, data: torch.Tensor, scale: torch.Tensor | None, format: Format, backend: str,
                  shape: tuple[int, ...], granularity: tuple[int, int], storage_granularity: tuple[int, int],
                  ue8m0: bool = False, element: str = "e4m3",
                  params: tuple[tuple[str, Any], ...] = ()) -> "PreparedTensor":
        """A PreparedTensor without the Format check, for bytes the library has just produced (an
        encode, a provider writing a Format, a decode): the hot path of prepared activations."""
        p = object.__new__(cls)
        s = _PREPARED_SLOTS  # the frozen class's slot setters (no per-field __setattr__ dispatch)
        s["data"](p, data)
        s["scale"](p, scale)
        s["format"](p, format)
        s["backend"](p, backend)
        s["shape"](p, shape)
        s["granularity"](p, granularity)
        s["storage_granularity"](p, storage_granularity)
        s["ue8m0"](p, ue8m0)
        s["element"](p, element)
        s["params"](p, params)
        s["signature"](p, ("prepared", backend, format.name, params, element, data.dtype, data.device, granularity,
                           storage_granularity, ue8m0))
        return p

    def __iter__(self) -> Iterator[torch.Tensor | None]:
        yield self.data
        yield self.scale

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor | None:
        return _pair_item(self, index)

    @property
    def tag(self) -> LayoutTag:
        return LayoutTag(self.backend, self.format.name, self.params)

    @property
    def device(self) -> torch.device:
        return self.data.device

    def __reduce__(self):
        # by the Format's name, so a pickled operand needs only the package that defines its format
        return _rebuild_prepared, (self.data, self.scale, self.format.name, self.backend, tuple(self.shape),
                                   tuple(self.granularity), tuple(self.storage_granularity), self.ue8m0, self.element,
                                   self.params)

    def __repr__(self) -> str:
        scale = "none" if self.scale is None else (
            f"{self.scale.dtype} {tuple(self.scale.shape)} strides {self.scale.stride()}")
        return (f"PreparedTensor({self.tag}, logical {self.element} {tuple(self.shape)}, "
                f"data {self.data.dtype} {tuple(self.data.shape)}, scale {scale}, device={self.device})")


def _slot_setters(cls: type) -> dict[str, Any]:
    """field -> the slot descriptor's __set__ of a frozen attrs class (writes without __setattr__)."""
    return {a.name: cls.__dict__[a.name].__set__ for a in attrs.fields(cls)}


_PREPARED_SLOTS = _slot_setters(PreparedTensor)
_QUANT_SLOTS = _slot_setters(QuantTensor)


def _positive_pair(value: Any) -> bool:
    return (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value))


def _check_prepared(p: PreparedTensor) -> None:
    where = "PreparedTensor"
    if not isinstance(p.format, Format):
        known = ", ".join(sorted(known_formats()))
        raise ContractError(f"{where}: format is {describe(p.format)}; expected a Format object (known formats: "
                            f"{known}). Fix: build prepared operands with prepare_inputs, or pass "
                            f"portable_kernels.core.formats.format_named(name).")
    if not isinstance(p.data, torch.Tensor) or not (p.scale is None or isinstance(p.scale, torch.Tensor)):
        raise ContractError(f"{where}: data and scale must be tensors (scale may be None); got "
                            f"{describe(p.data)} and {describe(p.scale)}.")
    shape = p.shape
    if not (isinstance(shape, (tuple, list, torch.Size)) and len(shape) >= 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape)):
        raise ContractError(f"{where}: shape {shape!r} must be the logical [..., MN, K] as ints >= 0.")
    object.__setattr__(p, "shape", tuple(shape))
    for name in ("granularity", "storage_granularity"):
        if not _positive_pair(getattr(p, name)):
            raise ContractError(f"{where}: {name} {getattr(p, name)!r} must be a pair of positive ints.")
        object.__setattr__(p, name, tuple(getattr(p, name)))
    if p.element not in p.format.elements:
        raise ContractError(f"{where}: element {p.element!r} is not one {p.format.name} holds "
                            f"({', '.join(p.format.elements)}).")
    if p.scale is not None and p.scale.device != p.data.device:
        raise ContractError(f"{where}: scale is on {p.scale.device} but data on {p.data.device}.")
    problem = p.format.check(p) if p.scale is not None else "it has no scale"
    if problem is not None:
        raise LayoutError(f"{where}({p.backend}:{p.format.name}, logical {p.element} {tuple(p.shape)}): {problem}. "
                          f"Fix: build prepared operands with prepare_inputs from a QuantTensor, never by hand.")


def _pair_item(value: QuantTensor | PreparedTensor, index: int) -> Any:
    """`value[0]` / `value[1]` (or -2 / -1): the data and scale of the (data, scale) pair a quantized
    operand stands for, as DeepGEMM code indexes its tuples (`x_fp8[0]`, `(a[0].T, a[1].T)`)."""
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"{type(value).__name__} indices must be 0 (data) or 1 (scale), not {type(index).__name__}")
    if index in (0, -2):
        return value.data
    if index in (1, -1):
        return value.scale
    raise IndexError(f"{type(value).__name__} is a (data, scale) pair; index {index} is out of range")


def _rebuild_prepared(data, scale, format_name, backend, shape, granularity, storage_granularity, ue8m0, element,
                      params) -> PreparedTensor:
    try:
        fmt = format_named(format_name)
    except KeyError as exc:
        raise LayoutError(f"cannot load a PreparedTensor: {exc.args[0]}") from None
    return PreparedTensor(data, scale, fmt, backend, shape, granularity, storage_granularity, ue8m0, element, params)
