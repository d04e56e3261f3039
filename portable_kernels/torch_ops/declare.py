"""An op's custom-op registration built from its public function: schema, route, implementation and fake.

`custom_op(public_fn, ...)` reads the public function's signature (names, kinds, defaults, type
hints) and its contract's quantized arguments, and defines `torch.ops.portable_kernels.<op>`:

- the schema: one argument per public parameter in order — a quantized argument as the ten
  `boundary.OPERAND_FIELDS`, a `pairs` argument as `Tensor x_data, Tensor x_scale`, a written one
  as `Tensor(x!)`, everything else by its type hint (`torch.Tensor | None` -> `Tensor?`,
  `tuple[int, ...]` -> `int[]`, `torch.dtype` -> `ScalarType`, ...); `types` names the schema
  type of a parameter whose hint does not say it, `local` the parameters the route handles itself
  (never crossing), `tail` the parameters appended to a published schema (last, with their default);
  a quantizer's `prepare_for, arg` become its consumer and the traced target (`_CONSUMER_FIELDS`),
  a value of another kind crosses as its declared `Crossing` (an MlaMetadata), and `extra` adds
  arguments the route computes while tracing (get_mla_metadata's backend);
- the route (what `compiled_call` runs under torch.compile), with the public signature: it runs
  `before` when given (checks, allocating outputs the caller left None), takes operands apart
  (`operand_args`), calls the op and passes its outputs to `result` when given;
- the implementation: it rebuilds the operands (`rebuild_operand`), calls the public function —
  validation, registry, plan cache and provider run inside — and returns its tensors (`outputs`
  turns a public result into the op's tensors), never an input or a view of one (`fresh`, unless
  `fresh_outputs=False`: a quantizer's bytes keep their Format's strides);
- the fake: nothing for an op returning `()`, else `fake(**schema arguments)`.

The route and the implementation are generated as plain functions (as attrs generates `__init__`),
so dynamo traces the route without a graph break and the implementation pays no argument
binding at run time. The one rule: a new op needs its contract and public function, plus at most
this one call; nothing else in torch_ops repeats its signature.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Mapping

import attrs

from ..core.compiled import ROUTES
from ..core.contract import OpContract, get_contract
from .boundary import OPERAND_FIELDS, cast_target, consumer_name, define
from .boundary import fresh, op, operand_args, rebuild_operand  # noqa: F401  (read by the generated functions)

__all__ = ["OpSpec", "SPECS", "custom_op", "schema_type"]

#: type hint (as written, `from __future__ import annotations`) -> schema type
_HINTS = {"torch.Tensor": "Tensor", "int": "int", "float": "float", "bool": "bool", "str": "str",
          "torch.dtype": "ScalarType", "list[torch.Tensor]": "Tensor[]", "tuple[torch.Tensor, ...]": "Tensor[]"}
_INT_LIST = re.compile(r"^(tuple\[int(, int)*\]|tuple\[int, \.\.\.\]|list\[int\])$")


def schema_type(hint: Any) -> str | None:
    """The schema type of a public parameter's type hint, None when the hint does not say one."""
    text = hint if isinstance(hint, str) else getattr(hint, "__name__", "")
    optional = text.endswith(" | None")
    base = text[:-len(" | None")] if optional else text
    kind = _HINTS.get(base) or ("int[]" if _INT_LIST.match(base) else None)
    if kind is None:
        return None
    return f"{kind}?" if optional else kind


@attrs.frozen
class Crossing:
    """How a public argument that is neither a tensor nor a plain value crosses (an MlaMetadata):
    its schema arguments (type, name), `to_op(value)` -> their values (in the route) and
    `from_op(*values)` -> the value again (in the implementation), given the schema arguments
    `reads` names (default: its own)."""

    fields: tuple[tuple[str, str], ...]
    to_op: Callable[[Any], tuple]
    from_op: Callable[..., Any]
    reads: tuple[str, ...] = ()

    def read(self) -> tuple[str, ...]:
        return self.reads or tuple(n for _, n in self.fields)


@attrs.frozen
class OpSpec:
    """What the signature alone cannot say about one op (see the module docstring)."""

    public: Callable[..., Any]
    writes: tuple[str, ...] = ()
    pairs: tuple[str, ...] = ()
    local: tuple[str, ...] = ()
    tail: tuple[str, ...] = ()
    types: Mapping[str, str] = attrs.field(factory=dict)
    returns: str = "()"
    fake: Callable[..., Any] | None = None
    outputs: Callable[..., Any] | None = None
    result: Callable[..., Any] | None = None
    fresh_outputs: bool = True
    crossings: Mapping[str, Crossing] = attrs.field(factory=dict)
    before: Callable[..., Mapping[str, Any]] | None = None
    extra: Mapping[str, tuple[str, Callable[..., Any]]] = attrs.field(factory=dict)
    contract: OpContract | None = None


#: op name -> its spec (what the generated functions read)
SPECS: dict[str, OpSpec] = {}


#: the schema arguments a quantizer's `prepare_for, arg` become: the consumer op and argument, and
#: the (backend, Format, options) the traced graph expects its result in (`boundary.cast_target`)
_CONSUMER_FIELDS = (("str", "prepare_for"), ("str", "arg"), ("str", "target_backend"), ("str", "target_format"),
                    ("str[]", "target_params"))


@attrs.frozen
class _Param:
    """One public parameter and how it crosses: kind "operand", "pair", "list" (int[] from a
    tuple), "tuple" (int[] back to a tuple), or "plain"."""

    name: str
    crossing: str
    schema: tuple[str, ...]  # its schema arguments ("Tensor a_data", ...)
    names: tuple[str, ...]   # their names


def _params(name: str, spec: OpSpec, operands: tuple[str, ...]) -> tuple[list[_Param], list[inspect.Parameter]]:
    signature = inspect.signature(spec.public)
    crossing = [p for p in signature.parameters.values() if p.name not in spec.local]
    consumer = "prepare_for" in signature.parameters
    if consumer:  # `arg` crosses with prepare_for
        crossing = [p for p in crossing if p.name != "arg"]
    ordered = [p for p in crossing if p.name not in spec.tail] + [p for p in crossing if p.name in spec.tail]
    out = []
    for p in ordered:
        if p.name in operands:
            names = tuple(f"{p.name}_{field}" for _, field in OPERAND_FIELDS)
            out.append(_Param(p.name, "operand", tuple(f"{k} {n}" for (k, _), n in zip(OPERAND_FIELDS, names)),
                              names))
            continue
        if p.name == "prepare_for":
            out.append(_Param(p.name, "consumer", tuple(f"{k} {n}" for k, n in _CONSUMER_FIELDS),
                              tuple(n for _, n in _CONSUMER_FIELDS)))
            continue
        if p.name in spec.crossings:
            fields = spec.crossings[p.name].fields
            out.append(_Param(p.name, "crossing", tuple(f"{k} {n}" for k, n in fields), tuple(n for _, n in fields)))
            continue
        if p.name in spec.pairs:
            names = (f"{p.name}_data", f"{p.name}_scale")
            out.append(_Param(p.name, "pair", tuple(f"Tensor {n}" for n in names), names))
            continue
        kind = spec.types.get(p.name) or schema_type(p.annotation)
        if kind is None:
            raise TypeError(f"{name}: parameter {p.name!r} has type hint {p.annotation!r}, which names no schema "
                            f"type. Fix: annotate it (e.g. 'torch.Tensor | None', 'tuple[int, ...]') or pass "
                            f"types={{{p.name!r}: 'int[]?'}} to custom_op.")
        if p.name in spec.writes:
            kind = kind.replace("Tensor", f"Tensor({p.name[0]}!)", 1)
        arg = f"{kind} {p.name}"
        if p.name in spec.tail:
            arg += f"={_schema_default(name, p)}"
        hint = str(p.annotation)
        crossing_kind = "plain"
        if kind.startswith("int[]"):
            crossing_kind = "tuple" if hint.startswith("tuple") else "list"
        out.append(_Param(p.name, crossing_kind, (arg,), (p.name,)))
    at = len(out) - sum(p.name in spec.tail for p in ordered)
    out[at:at] = [_Param(extra, "extra", (f"{kind} {extra}",), (extra,)) for extra, (kind, _) in spec.extra.items()]
    return out, list(signature.parameters.values())


def _schema_default(name: str, p: inspect.Parameter) -> str:
    value = p.default
    if value is inspect.Parameter.empty:
        raise TypeError(f"{name}: tail parameter {p.name!r} has no default")
    if value is None:
        return "None"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _route_source(name: str, params: list[_Param], public_params: list[inspect.Parameter],
                  spec: OpSpec) -> str:
    heads, seen_kw_only = [], False
    for p in public_params:
        if p.kind is p.KEYWORD_ONLY and not seen_kw_only:
            heads.append("*")
            seen_kw_only = True
        heads.append(p.name)
    keywords = ", ".join(f"{p.name}={p.name}" for p in public_params)
    args = []
    for p in params:
        if p.crossing == "extra":
            args.append(f"_spec.extra[{p.name!r}][1]({keywords})")
        elif p.crossing == "crossing":
            args.append(f"*_spec.crossings[{p.name!r}].to_op({p.name})")
        elif p.crossing == "operand":
            args.append(f"*operand_args({p.name}, _spec.contract, {p.name!r})")
        elif p.crossing == "pair":
            args.append(f"*_pair({p.name})")
        elif p.crossing == "consumer":
            args.append(f"*_consumer({name!r}, {public_params[0].name}.device, prepare_for, arg)")
        elif p.crossing in ("list", "tuple"):
            args.append(f"_as_list({p.name})")
        else:
            args.append(p.name)
    lines = [f"def {name}({', '.join(heads)}):",
             f"    _spec = SPECS[{name!r}]"]
    if spec.before is not None:
        lines.append(f"    _changed = _spec.before({keywords})")
        lines += [f"    {p.name} = _changed.get({p.name!r}, {p.name})" for p in public_params]
    lines.append(f"    _outputs = op({name!r})({', '.join(args)})")
    if spec.result is None:
        lines.append("    return _outputs")
    else:
        lines.append(f"    return _spec.result(_outputs, {keywords})")
    return "\n".join(lines) + "\n"


def _impl_source(name: str, params: list[_Param], public_params: list[inspect.Parameter], spec: OpSpec) -> str:
    schema_names = [n for p in params for n in p.names]
    schema_keywords = ", ".join(f"{n}={n}" for n in schema_names)
    by_name = {p.name: p for p in params}
    calls = []
    for p in public_params:
        crossed = by_name.get(p.name)
        if p.name == "arg" and "prepare_for" in by_name:
            value = "arg"
        elif crossed is None:
            value = "None"  # a `local` parameter: the route handles it, the op does not see it
        elif crossed.crossing == "operand":
            value = f"rebuild_operand({name!r}, {p.name!r}, {', '.join(crossed.names)})"
        elif crossed.crossing == "pair":
            value = f"({crossed.names[0]}, {crossed.names[1]})"
        elif crossed.crossing == "consumer":
            value = "prepare_for or None"
        elif crossed.crossing == "crossing":
            value = f"_spec.crossings[{p.name!r}].from_op({', '.join(spec.crossings[p.name].read())})"
        elif crossed.crossing == "tuple":
            value = f"_as_tuple({p.name})"
        else:
            value = p.name
        calls.append(f"{p.name}={value}" if p.kind is p.KEYWORD_ONLY else value)
    lines = [f"def {name}_impl({', '.join(schema_names)}):",
             f"    _spec = SPECS[{name!r}]",
             f"    _value = _spec.public({', '.join(calls)})"]
    if spec.returns == "()":
        lines.append("    return None")
    else:
        tensors = [n for p in params for n, arg in zip(p.names, p.schema) if arg.startswith("Tensor")]
        produced = f"_spec.outputs(_value, {schema_keywords})" if spec.outputs is not None else "_value"
        if spec.fresh_outputs:
            lines.append(f"    return fresh({produced}, {', '.join(tensors)})")
        else:
            lines.append(f"    return {produced}")
    lines.append(f"def {name}_fake({', '.join(schema_names)}):")
    if spec.returns == "()":
        lines.append("    return None")
    else:
        lines.append(f"    return SPECS[{name!r}].fake({schema_keywords})")
    return "\n".join(lines) + "\n"


def _as_list(value: Any) -> list[int] | None:
    return None if value is None else list(value)


def _as_tuple(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


def _pair(value: Any) -> tuple[Any, Any]:
    """A plain (data, scale) operand's two tensors; anything else crosses as (value, None) and the
    op names what is wrong."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value[0], value[1]
    return value, None


def _consumer(name: str, device: Any, prepare_for: Any, arg: str) -> tuple[str, str, str, str, list[str]]:
    """A quantizer's consumer as the op's arguments: its name, `arg`, and the bytes the result takes
    for it as selected while tracing (fixed in the graph; the op checks them when it runs)."""
    consumer = consumer_name(prepare_for)
    backend, fmt, params = cast_target(name, device, consumer, arg)
    return consumer, arg, backend, fmt, list(params)


#: the globals the generated functions read (an argument of that name would hide one)
_RESERVED = frozenset({"SPECS", "op", "fresh", "operand_args", "rebuild_operand", "_as_list", "_as_tuple", "_pair",
                       "_consumer", "_spec", "_outputs", "_value", "_changed"})


def _compile(source: str, filename: str) -> dict[str, Any]:
    """Run generated source with this module's globals (so the functions read `op`, `SPECS`, ... here)."""
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), globals(), namespace)
    return namespace


def custom_op(public: Callable[..., Any], **spec_fields: Any) -> OpSpec:
    """Define `torch.ops.portable_kernels.<op>` for public function `public` and register its route.

    Keywords are the fields of OpSpec: writes, pairs, local, tail, types, returns, fake, outputs,
    result, fresh_outputs, crossings, before, extra (module docstring). Returns the spec; the schema
    is in `boundary.SCHEMAS`."""
    name = public.__pk_op__
    contract = get_contract(name)
    spec = OpSpec(public, contract=contract, **spec_fields)
    if spec.returns != "()" and spec.fake is None:
        raise TypeError(f"{name}: returns {spec.returns} needs a fake (fake=lambda **args: ...)")
    operands = tuple(q.name for q in contract.quant_args if q.name not in spec.pairs)
    params, public_params = _params(name, spec, operands)
    clashes = sorted(_RESERVED & ({p.name for p in public_params} | {n for p in params for n in p.names}))
    if clashes:
        raise TypeError(f"{name}: argument names {clashes} are names the generated functions use. Fix: rename them.")
    schema = f"{name}({', '.join(arg for p in params for arg in p.schema)}) -> {spec.returns}"
    SPECS[name] = spec
    source = _route_source(name, params, public_params, spec) + _impl_source(name, params, public_params, spec)
    made = _compile(source, f"<custom op {name}>")
    route, impl, fake = made[name], made[f"{name}_impl"], made[f"{name}_fake"]
    tail_defaults = tuple(p.default for p in inspect.signature(public).parameters.values() if p.name in spec.tail)
    impl.__defaults__ = fake.__defaults__ = tail_defaults or None
    route.__defaults__, route.__kwdefaults__ = public.__defaults__, public.__kwdefaults__
    route.__doc__ = f"Route of {name} under torch.compile (generated by torch_ops.declare)."
    route.__pk_source__ = impl.__pk_source__ = source
    define(schema, impl, fake)
    ROUTES[name] = route
    return spec

