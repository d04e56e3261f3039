"""What crosses the torch.library op boundary, and how: the one `Library`, operands as tensors plus
static attributes, and the selection facts a traced graph fixes at trace time.

A quantized operand (PreparedTensor, QuantTensor or a raw DeepGEMM `(data, scale)` pair) crosses
as ten schema arguments, `OPERAND_FIELDS`: its two tensors and its static attributes — the
Format's name (`format_named` finds the Format again), backend, backend options as "key=value"
strings, logical shape, granularity, storage granularity, ue8m0 and element. An empty format
means a logical operand: a QuantTensor when a granularity is given, else a raw pair whose
granularity the op infers as it does in eager mode. The op's implementation rebuilds the value
(a PreparedTensor checked like a hand-built one: its static attributes once by the constructor,
its bytes on every call by its Format) and calls the public function: the registry and plan cache
run inside the op.

Rule: routes (traced by dynamo) only read attributes and build values with `frozen_new`; anything
that reads the registry runs in a `trace_constant` function, whose result torch.compile fixes when
it traces. The ops' implementations check at run time that the backend they run on is the one
the graph was traced for, so a changed `use_backend` gives a LayoutError, never other bytes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.library import Library

from ..core.contract import OpContract, quant_operand
from ..core.errors import ContractError, LayoutError, format_problem
from ..core.formats import Format, format_named
from ..core.registry import registry, select_backend
from ..core.tensors import PreparedTensor, QuantTensor, describe

#: the namespace of every op: torch.ops.portable_kernels.<name>
NAMESPACE = "portable_kernels"
LIB = Library(NAMESPACE, "DEF")

#: the schema arguments one quantized operand becomes, in order (prefixed with the argument's name)
OPERAND_FIELDS = (("Tensor", "data"), ("Tensor", "scale"), ("str", "format"), ("str", "backend"),
                  ("str[]", "params"), ("SymInt[]", "shape"), ("int[]", "granularity"),
                  ("int[]", "storage_granularity"), ("bool", "ue8m0"), ("str", "element"))

def operand_schema(arg: str) -> str:
    """The schema fragment of quantized argument `arg`, e.g. 'Tensor a_data, Tensor a_scale, ...'."""
    return ", ".join(f"{kind} {arg}_{field}" for kind, field in OPERAND_FIELDS)


#: name -> schema of every op defined here (for docs and tests)
SCHEMAS: dict[str, str] = {}


def define(schema: str, impl: Callable[..., Any], fake: Callable[..., Any]) -> None:
    """Define `portable_kernels::<schema>` with its implementation (any device) and fake."""
    name = schema.split("(", 1)[0]
    LIB.define(schema)
    LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=LIB)
    SCHEMAS[name] = schema


def op(name: str) -> Any:
    """torch.ops.portable_kernels.<name>.default"""
    return getattr(getattr(torch.ops, NAMESPACE), name).default


# -- operands ------------------------------------------------------------------------------------


def params_to_strs(params: tuple[tuple[str, Any], ...]) -> list[str]:
    return [f"{key}={value}" for key, value in params]


_PARAMS: dict[tuple[str, tuple[str, ...]], tuple[tuple[str, Any], ...]] = {}


def params_from_strs(backend: str, strs: list[str]) -> tuple[tuple[str, Any], ...]:
    """Back to (key, value) pairs, each value the backend's declared option value of that spelling."""
    key = (backend, tuple(strs))
    params = _PARAMS.get(key)
    if params is None:
        declared = registry().backend(backend).options
        pairs = []
        for item in strs:
            name, _, spelled = item.partition("=")
            value = next((v for v in declared.get(name, ()) if str(v) == spelled), spelled)
            pairs.append((name, value))
        params = _PARAMS[key] = tuple(pairs)
    return params


def operand_args(value: Any, contract: OpContract | None = None, arg: str = "operand") -> tuple:
    """The OPERAND_FIELDS values of one quantized operand — a PreparedTensor, a QuantTensor or a raw
    `(data, scale)` pair — to splat into a `torch.ops.portable_kernels.*` call (traced by dynamo
    under torch.compile). Anything else raises the op's ContractError (`contract`, `arg`)."""
    if isinstance(value, PreparedTensor):
        return (value.data, value.scale, value.format.name, value.backend, params_to_strs(value.params),
                list(value.shape), list(value.granularity), list(value.storage_granularity), value.ue8m0,
                value.element)
    if isinstance(value, QuantTensor):
        granularity = list(value.granularity)
        return (value.data, value.scale, "", "", [], list(value.shape), granularity, granularity, value.ue8m0,
                value.element)
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        if contract is None:
            raise ContractError(format_problem("operand_args", arg, describe(value),
                                               "a PreparedTensor, a QuantTensor or a (data, scale) pair",
                                               "quantize first, e.g. per_token_cast_to_fp8(x, prepare_for=op)"))
        quant_operand(contract, arg, value)  # raises the op's own error for what is not an operand
    data, scale = value
    return (data, scale, "", "", [], list(data.shape), [], [], False, "")


#: static attributes of prepared operands already checked by PreparedTensor's constructor
_CHECKED: dict[tuple, tuple] = {}
_MAX_CHECKED = 1024


def rebuild_operand(op_name: str, arg: str, data: torch.Tensor, scale: torch.Tensor, format: str, backend: str,
                    params: list[str], shape: list[int], granularity: list[int], storage_granularity: list[int],
                    ue8m0: bool, element: str) -> PreparedTensor | QuantTensor | tuple[torch.Tensor, torch.Tensor]:
    """The value `operand_args` flattened (inside an op's implementation). A prepared operand is
    checked like a hand-built one: the first time its static attributes are seen by
    PreparedTensor's constructor, then (a graph passes the same constants on every call) its bytes
    by its Format's check — shapes, dtypes, strides."""
    if not format:
        if granularity:
            return QuantTensor(data, scale, tuple(granularity), ue8m0, element)
        return (data, scale)
    key = (format, backend, tuple(params), tuple(granularity), tuple(storage_granularity), ue8m0, element)
    statics = _CHECKED.get(key)
    if statics is None:
        try:
            fmt = format_named(format)
        except KeyError as exc:
            raise LayoutError(f"{op_name}: argument '{arg}': {exc.args[0]}") from None
        value = PreparedTensor(data, scale, fmt, backend, tuple(shape), key[3], key[4], ue8m0, element,
                               params_from_strs(backend, params))
        if len(_CHECKED) >= _MAX_CHECKED:
            _CHECKED.clear()
        _CHECKED[key] = (value.format, value.params, value.granularity, value.storage_granularity)
        return value
    fmt, params_t, gran, storage_gran = statics
    value = PreparedTensor.unchecked(data, scale, fmt, backend, tuple(shape), gran, storage_gran, ue8m0, element,
                                     params_t)
    problem = None
    if scale.device != data.device:
        problem = f"scale is on {scale.device} but data on {data.device}"
    elif len(shape) < 2 or min(shape) < 0:
        problem = f"shape {list(shape)} is not a logical [..., MN, K] of sizes >= 0"
    else:
        problem = fmt.check(value)
    if problem is not None:
        raise LayoutError(f"{op_name}: argument '{arg}' ({backend}:{format}, logical {element} {tuple(shape)}): "
                          f"{problem}. Fix: pass the tensors of a PreparedTensor from prepare_inputs (or a "
                          f"quantizer's prepare_for) as they are.")
    return value


def _root(t: torch.Tensor) -> torch.Tensor:
    base = t._base
    return t if base is None else base


def fresh(outputs: Any, *inputs: Any) -> Any:
    """Outputs as an op may return them: row-major, as the fakes promise (a provider may return a
    strided view, e.g. the first k columns of a sort), and never an input or a view of one (a
    provider may hand back a tensor it was given, e.g. block_cast's given scales). A no-op in the
    usual case."""
    roots = [_root(t) for t in inputs if t is not None]

    def one(t: torch.Tensor) -> torch.Tensor:
        out = t.contiguous()
        root = _root(out)
        return out.clone() if any(r is root for r in roots) else out

    if isinstance(outputs, torch.Tensor):
        return one(outputs)
    return type(outputs)(one(t) for t in outputs)


def frozen_new(cls: type, **fields: Any) -> Any:
    """An instance of a frozen attrs class built field by field, as `PreparedTensor.unchecked` does,
    in the one form dynamo traces (it follows neither attrs' generated __init__ of frozen classes
    nor the slot descriptors `unchecked` writes through)."""
    obj = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


# -- fakes a provider declares ----------------------------------------------------------------------

_PROVIDER_FAKES: dict[tuple[str, str, str], Callable[[Any], Any]] = {}


def register_provider_fake(op: str, backend: str, provider: str, fake: Callable[[Any], Any]) -> None:
    """Declare what provider (op, backend, provider) returns, computed from sizes only: `fake(inputs)`
    runs on fake tensors while torch.compile traces and returns outputs of the right shapes, dtypes
    and strides (`torch.library.get_ctx().new_dynamic_size()` for a size read from values). Needed
    only where an op's output shapes depend on its provider (get_mla_metadata's scheduling tensors)
    and the provider reads values on the host."""
    _PROVIDER_FAKES[(op, backend, provider)] = fake


def provider_fake(provider: Any) -> Callable[[Any], Any] | None:
    return _PROVIDER_FAKES.get((provider.op, provider.backend, provider.name))


# -- selection facts fixed at trace time -------------------------------------------------------------


def trace_constant(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark `fn` so torch.compile calls it while tracing (with constant arguments) and keeps its
    result as a constant — what torch.compiler.assume_constant_result does; set here directly so
    that importing portable_kernels does not import torch._dynamo (seconds)."""
    fn._dynamo_marked_constant = True
    return fn


@trace_constant
def selected(op_name: str, device: torch.device, tags: tuple[tuple[str, tuple], ...] = ()) -> tuple:
    """(backend name, its options as "key=value" strings, its MoE alignment) for a call of `op_name`
    on `device` with prepared arguments tagged `tags` ((backend, params) pairs), as selected now."""
    selection = select_backend(op_name, device, {str(i): tag for i, tag in enumerate(tags)})
    backend = selection.backend
    params = tuple(sorted((k, v) for k, v in selection.options.items() if k in backend.options))
    return backend.name, tuple(params_to_strs(params)), backend.moe_alignment


@trace_constant
def cast_target(op_name: str, device: torch.device, consumer: str, arg: str) -> tuple[str, str, tuple[str, ...]]:
    """(backend, Format name, options) a quantizer's result takes for `consumer`'s argument `arg`
    (its `prepare_for`), as selected now; ("", "", ()) without a consumer."""
    if not consumer:
        return "", "", ()
    from ..core.contract import get_contract
    from ..core.prepare import backend_params
    selection = select_backend(op_name, device, {})
    backend = selection.backend
    target = get_contract(consumer)
    fmt = backend.format_for(target.name, target.quant_arg(arg), selection.options)
    params = backend_params(backend, dict(selection.options)) if backend.options else ()
    return backend.name, fmt.name, tuple(params_to_strs(params))


def consumer_name(prepare_for: Any) -> str:
    """A quantizer's `prepare_for` (an op name, a public function or None) as the op's name ("" for None)."""
    if prepare_for is None:
        return ""
    if isinstance(prepare_for, str):
        return prepare_for
    return getattr(prepare_for, "__pk_op__", "") or repr(prepare_for)


def check_ran_on(op_name: str, what: str, expected: tuple[str, ...], actual: tuple[str, ...]) -> None:
    """Refuse a result computed for another backend/Format than the graph was traced for."""
    if expected[0] and tuple(expected) != tuple(actual):
        raise LayoutError(
            f"{op_name}: {what} is {'/'.join(str(v) for v in actual if v)} now, but the torch.compile graph "
            f"calling it was traced for {'/'.join(str(v) for v in expected if v)}. Fix: call the compiled function "
            f"under the use_backend(...) it was compiled under, or compile it again (torch._dynamo.reset()).")


def format_of(name: str, op_name: str, arg: str) -> Format:
    try:
        return format_named(name)
    except KeyError as exc:
        raise LayoutError(f"{op_name}: argument '{arg}': {exc.args[0]}") from None


def require(op_name: str, arg: str, value: Any, kind: type, expected: str, fix: str) -> None:
    """A route's check of a value it must take apart (the op's implementation checks the rest)."""
    if not isinstance(value, kind):
        raise ContractError(format_problem(op_name, arg, describe(value), expected, fix))
