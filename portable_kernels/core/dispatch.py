"""Running an op: pick the backend and provider for a call, once per call signature, and run it.

`run(contract, inputs)` looks the call up by (op, forced backend and options, `inputs.signature()`)
— formats, dtypes, devices and flags, never sizes — in a plan cache. A miss builds the plan: the
backend by the selection rule, a check of every prepared operand's Format, the conversions of
unprepared ones (counted on every call), and the provider: the first by priority with no reason
to decline, decided once. Providers with limits or a shape class are asked per shape class
instead: a call walks them in priority order, computing only their shape keys up to the first
that accepts (each verdict cached in the plan). The hot path is two dictionary lookups and the
provider call.
The cache is dropped whenever the registry changes (a plugin registers a provider).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import attrs

from .contract import OpContract
from .errors import NoKernelError
from .prepare import to_backend
from .providers import Inputs, Provider
from .registry import REGISTRY, Selection, common_device, forced_key, not_mapped_reasons, registry, select_backend
from .tensors import PreparedTensor, QuantTensor

#: plans kept before the cache is reset (a guard against unbounded growth, not an LRU)
MAX_PLANS = 4096

_plans: dict[tuple, "Plan"] = {}
_selections: dict[tuple, Selection] = {}
_generation = -1


@attrs.define(eq=False)
class Plan:
    """How calls of one signature run: the backend selection, the conversion of unprepared operands
    (None when every quantized operand is prepared), and the provider — fixed, or chosen per shape
    class when a candidate declares limits or a shape class."""

    contract: OpContract
    selection: Selection
    convert: Callable[[Any], Any] | None
    #: the providers a call may still need to ask, in priority order: shape-dependent ones, ending
    #: with at most one that accepts every call of this signature
    candidates: tuple[Provider, ...]
    provider: Provider | None = None
    #: reasons of the providers that decline every call of this signature (shown in NoKernelError)
    reasons: dict[str, list[str]] | None = None
    #: (candidate index, shape key) -> that candidate's reasons for the shape class ([]: accepts)
    verdicts: dict[tuple, list[str]] = attrs.field(factory=dict)

    @property
    def backend(self) -> str:
        return self.selection.backend.name

    def provider_for(self, inputs: Any) -> Provider:
        """The provider for these (already converted) inputs; NoKernelError with every reason if none."""
        if self.provider is not None:
            return self.provider
        verdicts = []
        for index, provider in enumerate(self.candidates):
            key = (index, provider.shape_key(inputs)) if provider.shape_dependent else (index,)
            verdict = self.verdicts.get(key)
            if verdict is None:
                verdict = self.verdicts[key] = provider.not_supported_reasons(inputs)
            if not verdict:
                return provider
            verdicts.append(verdict)
        declined = {**not_mapped_reasons(self.selection.backend, self.contract.name), **(self.reasons or {})}
        declined.update((p.name, v) for p, v in zip(self.candidates, verdicts))
        raise NoKernelError(self.contract.name, self.backend, declined)

    def accepts(self, inputs: Any) -> bool:
        """Whether some provider runs these inputs (no exception, cached like a call)."""
        try:
            self.provider_for(inputs)
        except NoKernelError:
            return False
        return True


def _tensors(values: Any) -> list:
    import torch
    out = []
    for value in values:
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (QuantTensor, PreparedTensor)):
            out.append(value.data)
        elif isinstance(value, (tuple, list)):
            out.extend(_tensors(value))
    return out


def _caches() -> tuple[dict, dict]:
    global _generation
    reg = registry()
    reg.ensure_loaded()
    if reg.generation != _generation or len(_plans) > MAX_PLANS:
        _plans.clear()
        _selections.clear()
        _generation = reg.generation
    return _plans, _selections


def _quantized(contract: OpContract, inputs: Inputs) -> dict[str, QuantTensor | PreparedTensor]:
    out = {}
    for qa in contract.quant_args:
        value = getattr(inputs, qa.name, None)
        if isinstance(value, (QuantTensor, PreparedTensor)):
            out[qa.name] = value
    return out


def _select(contract: OpContract, inputs: Inputs) -> Selection:
    quant = _quantized(contract, inputs)
    tags = {arg: (v.backend, v.params) for arg, v in quant.items() if isinstance(v, PreparedTensor)}
    device = common_device(contract.name, _tensors(inputs.operands().values()))
    return select_backend(contract.name, device, tags)


def selection_for(contract: OpContract, inputs: Inputs) -> Selection:
    """The backend (and its options) that runs this call — cached like plans."""
    _, selections = _caches()
    key = (contract.name, forced_key(), inputs.signature())
    selection = selections.get(key)
    if selection is None:
        selection = selections[key] = _select(contract, inputs)
    return selection


def _make_plan(contract: OpContract, inputs: Inputs) -> Plan:
    selection = selection_for(contract, inputs)
    quant = _quantized(contract, inputs)
    unprepared = []
    probe = {}
    for arg, value in quant.items():
        probe[arg] = to_backend(contract, arg, value, selection, implicit=False)  # checks, or converts once
        if not isinstance(value, PreparedTensor):
            unprepared.append(arg)
    convert = None
    if unprepared:
        def convert(call: Any, _args: tuple[str, ...] = tuple(unprepared)) -> Any:
            changes = {}
            for arg in _args:  # a loop, not a comprehension: keeps the warning's call site simple
                changes[arg] = to_backend(contract, arg, getattr(call, arg), selection, implicit=True)
            return call.replace(**changes)
    converted = inputs.replace(**probe) if probe else inputs
    # providers without limits or a shape class answer once for the whole signature: those that
    # decline leave only their reasons, the first that accepts ends the list
    candidates: list[Provider] = []
    reasons: dict[str, list[str]] = {}
    for provider in registry().providers(contract.name, selection.backend.name):
        if provider.shape_dependent:
            candidates.append(provider)
            continue
        declined = provider.not_supported_reasons(converted)
        if not declined:
            candidates.append(provider)
            break
        reasons[provider.name] = declined
    plan = Plan(contract, selection, convert, tuple(candidates), reasons=reasons or None)
    if candidates and not candidates[-1].shape_dependent:
        plan.verdicts[(len(candidates) - 1,)] = []  # it accepted above
        if len(candidates) == 1:
            plan.provider = candidates[0]
    return plan


def plan_for(contract: OpContract, inputs: Inputs) -> Plan:
    """The cached plan for calls with this signature (built on first use)."""
    key = (contract.name, forced_key(), inputs.signature())
    plan = _plans.get(key)
    if plan is None or REGISTRY.generation != _generation:
        plans, _ = _caches()
        plan = plans[key] = _make_plan(contract, inputs)
    return plan


def run(contract: OpContract, inputs: Inputs) -> Any:
    """Run one validated call: convert unprepared operands (counted), then the chosen provider.

    `plan_for` and `run_plan` written out in one frame: on a call of a few µs each Python call
    level costs ~0.1 µs (issue 23)."""
    key = (contract.name, forced_key(), inputs.signature())
    plan = _plans.get(key)
    if plan is None or REGISTRY.generation != _generation:
        plans, _ = _caches()
        plan = plans[key] = _make_plan(contract, inputs)
    if plan.convert is not None:
        inputs = plan.convert(inputs)
    provider = plan.provider
    if provider is None:
        provider = plan.provider_for(inputs)
    if _trace is not None:
        _trace.append((provider.op, provider.backend, provider.name))
    return provider.fn(inputs)


def run_plan(plan: Plan, inputs: Inputs) -> Any:
    """`run` with the plan already looked up (an op that first needs the backend, e.g. its alignment)."""
    if plan.convert is not None:
        inputs = plan.convert(inputs)
    provider = plan.provider_for(inputs)
    if _trace is not None:
        _trace.append((provider.op, provider.backend, provider.name))
    return provider.fn(inputs)


_trace: list[tuple[str, str, str]] | None = None


@contextlib.contextmanager
def trace_providers() -> Iterator[list[tuple[str, str, str]]]:
    """Record (op, backend, provider) of every call run inside the block (for reports and tests;
    process-wide, so not meant for concurrent use)."""
    global _trace
    outer, _trace = _trace, []
    try:
        yield _trace
    finally:
        recorded, _trace = _trace, outer
        if outer is not None:
            outer.extend(recorded)


def record_choice(op: str, backend: str, name: str) -> None:
    """Record a choice made outside a provider call (e.g. the EP engine a Buffer built) in an
    active trace_providers block."""
    if _trace is not None:
        _trace.append((op, backend, name))


def provider_for(contract: OpContract, inputs: Inputs) -> Provider:
    """The provider a call with these inputs would run (for reports and tests)."""
    plan = plan_for(contract, inputs)
    if plan.convert is not None:
        inputs = plan.convert(inputs)
    return plan.provider_for(inputs)
