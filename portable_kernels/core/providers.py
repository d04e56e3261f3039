"""Kernel providers: the inputs value a kernel receives, the typed description of a kernel (what
it accepts, its declarative limits, every reason it declines), and `Limit`.

A provider is called with ONE argument, its op family's frozen inputs value (xformers' fmha
Inputs is the model): `GemmInputs(a, b, d, c)`, `TopkInputs(...)`, ... defined next to each op's
contract. Quantized operands in it are PreparedTensors carrying their Format, logical shape and
granularity — nothing is flattened into keyword arguments and nothing is rebuilt.
The one rule: whether a provider accepts a call may depend only on what selection caches on —
the op, backend, options, the inputs' `signature()` (formats, dtypes, devices, flags) and, for
shapes, the provider's `limits` and `shape_class`. So a shape-dependent `check` must come with a
`shape_class` that captures what it looks at.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, ClassVar, Hashable, Iterable, Mapping

import attrs
import torch

from .formats import PLAIN, Format, decode_operand
from .tensors import PreparedTensor, QuantTensor

KernelFn = Callable[[Any], Any]
CheckFn = Callable[[Any], Iterable[str]]

_FIELDS: dict[type, tuple[str, ...]] = {}
_GETTERS: dict[type, Callable[[Any], tuple]] = {}


def _fields(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(a.name for a in attrs.fields(cls))
    return names


#: field annotations that are sizes or numbers only, never part of a selection key
_NUMBER_ANNOTATIONS = ("int", "float")


def _getter(cls: type) -> Callable[[Any], tuple]:
    """attrgetter of the fields of an inputs class that can enter its signature (one C call returns
    them all); plain `int` / `float` fields (sizes, scales) are left out."""
    getter = _GETTERS.get(cls)
    if getter is None:
        names = tuple(a.name for a in attrs.fields(cls) if str(a.type) not in _NUMBER_ANNOTATIONS) or ("__class__",)
        single = operator.attrgetter(*names)
        getter = _GETTERS[cls] = single if len(names) > 1 else (lambda obj: (single(obj),))
    return getter


# how a field value enters the signature, by exact type: 0 as is, 1 tensor, 2 its .signature, 3 only its type
_KIND = {type(None): 0, bool: 0, str: 0, torch.dtype: 0, Format: 0, torch.Tensor: 1, PreparedTensor: 2,
         QuantTensor: 2, int: 3, float: 3, tuple: 4}
#: element types of a tuple that is kept as is (e.g. a granularity (1, 128))
_PLAIN_ITEMS = (int, bool, str, float, type(None))


def _signature_of(value: Any) -> Hashable:
    """The part of one field that selection may depend on (sizes and numbers are left out)."""
    kind = _KIND.get(type(value))
    if kind == 1:
        return (value.dtype, value.device)
    if kind == 0:
        return value
    if kind == 2:
        return value.signature
    if kind == 3:
        return type(value)
    if kind == 4 and all(type(v) in _PLAIN_ITEMS for v in value):
        return value
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.device)
    if isinstance(value, (tuple, list)):
        return tuple(_signature_of(v) for v in value)
    if isinstance(value, (bool, str, torch.dtype, Format)):
        return value
    return (type(value).__name__, getattr(value, "signature", None))


class Inputs:
    """Base of the per-family inputs values (subclasses are `attrs.frozen`).

    Subclasses name the tensor whose device the call runs on (`device_field`) and may override
    `dims()` (the named sizes `Limit`s test, e.g. {"M": .., "N": .., "K": ..}).
    """

    #: the field whose device is the call's device
    device_field: ClassVar[str] = ""

    @property
    def device(self) -> torch.device:
        value = getattr(self, self.device_field)
        if isinstance(value, (tuple, list)):
            value = value[0]
        return value.device

    def dims(self) -> dict[str, int]:
        """Named sizes of this call (what declarative limits test)."""
        return {}

    def signature(self) -> tuple:
        """What selection caches on: per field its Format/dtype/device or flag value, never sizes
        (fields annotated plain `int` or `float` are left out)."""
        out = []
        for value in _getter(type(self))(self):
            kind = _KIND.get(type(value))
            if kind == 1:
                out.append((value.dtype, value.device))
            elif kind == 0:
                out.append(value)
            elif kind == 2:
                out.append(value.signature)
            elif kind == 4 and len(value) == 2 and type(value[0]) is int and type(value[1]) is int:
                out.append(value)  # a granularity
            else:
                out.append(_signature_of(value))
        return tuple(out)

    def operands(self) -> dict[str, Any]:
        """Every field by name (what provider format/dtype declarations refer to)."""
        return {name: getattr(self, name) for name in _fields(type(self))}

    def replace(self, **changes: Any) -> Any:
        """A copy with some fields changed (like attrs.evolve, without its per-call introspection)."""
        names = _fields(type(self))
        return type(self)(*[changes.get(name, getattr(self, name)) for name in names])

    def decoded(self) -> Any:
        """The same call with every prepared operand decoded to the PLAIN format (fp32 row-major
        scales, ND data): what the contract's reference kernel reads."""
        changes = {name: decode_operand(value) for name, value in self.operands().items()
                   if isinstance(value, PreparedTensor) and value.format is not PLAIN}
        return self.replace(**changes) if changes else self


@attrs.frozen
class Limit:
    """A declarative bound on one named size of a call: `dim` within [min, max] and a multiple of
    `multiple_of`. Shown by `doctor`; a violated limit is a reason to decline."""

    dim: str
    min: int | None = None
    max: int | None = None
    multiple_of: int | None = None

    def reason(self, dims: Mapping[str, int]) -> str | None:
        value = dims.get(self.dim)
        if value is None:
            return f"size {self.dim!r} is not defined for this op (limit {self})"
        if self.min is not None and value < self.min:
            return f"{self.dim} = {value} < {self.min}"
        if self.max is not None and value > self.max:
            return f"{self.dim} = {value} > {self.max}"
        if self.multiple_of is not None and value % self.multiple_of:
            return f"{self.dim} = {value} is not a multiple of {self.multiple_of}"
        return None

    def __str__(self) -> str:
        parts = []
        if self.min is not None:
            parts.append(f"{self.dim} >= {self.min}")
        if self.max is not None:
            parts.append(f"{self.dim} <= {self.max}")
        if self.multiple_of is not None:
            parts.append(f"{self.dim} % {self.multiple_of} == 0")
        return ", ".join(parts) or f"{self.dim}: any"


def _frozen_mapping(value: Mapping[str, Iterable[Any]] | None) -> dict[str, tuple[Any, ...]]:
    return {k: tuple(v) for k, v in (value or {}).items()}


@attrs.frozen(eq=False)
class Provider:
    """One kernel for one op on one backend.

    op, backend, name: e.g. ("fp8_gemm_nt", "nvidia", "triton"); priority: higher is tried first
        (layout-reference oracles -100, cpu "reference" 0, native kernels above)
    fn:       the kernel, called with the op's inputs value
    formats:  argument -> the Formats it accepts (omitted arguments: any)
    dtypes:   argument -> the tensor dtypes it accepts (omitted: any)
    devices:  device types of the call it runs on ("cuda", "cpu" for emulation, ...); empty: any
    limits:   declarative size limits (`Limit`)
    check:    optional extra test, inputs -> reasons (each a sentence); must depend only on the
              selection key (see the module docstring)
    shape_class: optional, inputs -> a hashable class of the shapes `check` distinguishes
    doc:      one line for `doctor`
    """

    op: str
    backend: str
    name: str
    fn: KernelFn
    priority: int = 0
    formats: Mapping[str, tuple[Format, ...]] = attrs.field(factory=dict, converter=_frozen_mapping)
    dtypes: Mapping[str, tuple[torch.dtype, ...]] = attrs.field(factory=dict, converter=_frozen_mapping)
    devices: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    limits: tuple[Limit, ...] = attrs.field(default=(), converter=tuple)
    check: CheckFn | None = None
    shape_class: Callable[[Any], Hashable] | None = None
    doc: str = ""

    @property
    def shape_dependent(self) -> bool:
        return bool(self.limits) or self.shape_class is not None

    def shape_key(self, inputs: Any) -> Hashable:
        """The shape-dependent part of the selection key for this provider."""
        try:
            dims = inputs.dims() if self.limits else {}
            outcome = tuple(limit.reason(dims) is None for limit in self.limits)
            return outcome, (self.shape_class(inputs) if self.shape_class is not None else None)
        except Exception as exc:  # a broken check declines (see not_supported_reasons), never crashes
            return "error", type(exc).__name__

    def not_supported_reasons(self, inputs: Any) -> list[str]:
        """Every reason this provider cannot run `inputs` (empty: it can). Never raises."""
        try:
            return self._reasons(inputs)
        except Exception as exc:
            return [f"its support check raised {type(exc).__name__}: {exc}"]

    def _reasons(self, inputs: Any) -> list[str]:
        reasons: list[str] = []
        values = inputs.operands()
        for arg, accepted in self.formats.items():
            value = values.get(arg)
            fmt = value.format if isinstance(value, PreparedTensor) else value
            if isinstance(fmt, Format) and fmt not in accepted:
                names = ", ".join(f.name for f in accepted)
                reasons.append(f"argument '{arg}' is in format {fmt.name}; it reads {names}")
        for arg, accepted in self.dtypes.items():
            value = values.get(arg)
            tensor = value.data if isinstance(value, PreparedTensor) else value
            if isinstance(tensor, torch.Tensor) and tensor.dtype not in accepted:
                names = ", ".join(str(d).replace("torch.", "") for d in accepted)
                reasons.append(f"argument '{arg}' is {str(tensor.dtype).replace('torch.', '')}; it takes {names}")
        if self.devices:
            device = inputs.device
            if device.type not in self.devices:
                reasons.append(f"runs on {', '.join(self.devices)} tensors, not {device.type}")
        if self.limits:
            dims = inputs.dims()
            reasons.extend(r for r in (limit.reason(dims) for limit in self.limits) if r is not None)
        if self.check is not None:
            reasons.extend(str(r) for r in self.check(inputs))
        return reasons

    def describe(self) -> str:
        """One line for `doctor`: name, priority, accepted formats/dtypes/devices, limits."""
        parts = [f"{self.name} (priority {self.priority})"]
        if self.formats:
            parts.append("formats " + "; ".join(f"{arg}: {', '.join(f.name for f in fmts)}"
                                               for arg, fmts in self.formats.items()))
        if self.dtypes:
            parts.append("dtypes " + "; ".join(
                f"{arg}: {', '.join(str(d).replace('torch.', '') for d in ds)}" for arg, ds in self.dtypes.items()))
        if self.devices:
            parts.append(f"devices {', '.join(self.devices)}")
        if self.limits:
            parts.append("limits " + "; ".join(str(limit) for limit in self.limits))
        if self.check is not None:
            parts.append("plus its own checks")
        if self.doc:
            parts.append(self.doc)
        return " — ".join(parts)


def first_accepting(candidates: Iterable[Provider], inputs: Any) -> Provider | dict[str, list[str]]:
    """The first provider (in the given order) with no reason to decline, or every provider's reasons."""
    reasons: dict[str, list[str]] = {}
    for provider in candidates:
        declined = provider.not_supported_reasons(inputs)
        if not declined:
            return provider
        reasons[provider.name] = declined
    return reasons
