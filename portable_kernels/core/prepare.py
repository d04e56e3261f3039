"""The conversion step: a logical operand into a backend's Format, once, at ingest.

`prepare_inputs` converts an op's quantized arguments into the chosen backend's Formats and
returns PreparedTensors. `to_backend` is the one place a QuantTensor becomes a PreparedTensor
(also for quantizers' `prepare_for` and for the counted implicit conversions of raw tuples), and
the one place a prepared operand is checked against what the backend wants. Providers never
convert.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch

from .contract import OpContract, get_contract, public_function, quant_operand
from .conversions import note_implicit_conversion
from .errors import BackendUnavailableError, ContractError, LayoutError
from .formats import Format
from ..layouts.errors import LayoutConversionError
from ..layouts.ue8m0 import is_power_of_two
from .native.layout_encoders import accelerated_encode
from .kv_cache import PreparedKVCache, cache_bytes, cache_format_for, to_cache_format
from .registry import Backend, Selection, common_device, select_backend
from .tensors import PreparedTensor, QuantTensor


def backend_params(backend: Backend, options: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The options a prepared operand records: those its backend declares, sorted."""
    if not backend.options:
        return ()
    return tuple(sorted((k, v) for k, v in options.items() if k in backend.options))


def encode_operand(op: str, arg: str, backend: Backend, fmt: Format, options: dict[str, Any],
                   qt: QuantTensor) -> PreparedTensor:
    """Convert `qt` into `fmt`'s bytes for `backend`; refuse conversions that would change the math."""
    if qt.element not in fmt.elements:
        raise LayoutError(f"{op}: argument '{arg}' holds {qt.element} data, but {backend.name}:{fmt.name} stores "
                          f"{'/'.join(fmt.elements)}. Fix: quantize it to one of those element types.")
    if fmt.requires_pow2 and not (qt.ue8m0 or is_power_of_two(qt.scale)):
        raise LayoutError(
            f"{op}: argument '{arg}' has scales that are not powers of two, but backend {backend.name!r} stores "
            f"them as UE8M0 exponents ({fmt.name}); converting would change the math. Fix: quantize with "
            f"use_ue8m0=True (e.g. per_token_cast_to_fp8(x, use_ue8m0=True)) so every scale is a power of two.")
    try:
        # a native encoder writes the same bytes faster where one exists (portable_kernels.core.native)
        data, scale, storage_granularity = accelerated_encode(fmt, qt) or fmt.encode(qt)
    except LayoutConversionError as exc:
        raise LayoutError(f"{op}: argument '{arg}' cannot be stored as {backend.name}:{fmt.name}: {exc}") from exc
    data = backend.place_encoded(fmt, data)  # e.g. ascend: FRACTAL_NZ on an NPU, once, here
    return PreparedTensor.unchecked(data, scale, fmt, backend.name, tuple(qt.shape), tuple(qt.granularity),
                                    tuple(storage_granularity), qt.ue8m0 or fmt.requires_pow2, qt.element,
                                    backend_params(backend, options))


def to_backend(contract: OpContract, arg: str, value: QuantTensor | PreparedTensor, selection: Selection,
               implicit: bool) -> PreparedTensor:
    """Bring one quantized operand into `selection`'s Format for it: a prepared operand is checked,
    not converted; a logical one is converted (and, if `implicit`, counted and warned about once)."""
    backend = selection.backend
    want = backend.format_for(contract.name, contract.quant_arg(arg), selection.options)
    if isinstance(value, PreparedTensor):
        if value.backend != backend.name or value.format is not want:
            raise LayoutError(
                f"{contract.name}: argument '{arg}' is in layout {value.tag}, but backend {backend.name!r} needs "
                f"{backend.name}:{want.name} here. Fix: prepare it for this backend and device with "
                f"prepare_inputs({contract.name!r}, backend={backend.name!r}, {arg}=...).")
        return value
    if implicit:
        note_implicit_conversion(contract.name, arg, backend.name, want.name)
    return encode_operand(contract.name, arg, backend, want, dict(selection.options), value)


def _move(value: Any, device: torch.device | None) -> Any:
    if device is None:
        return value
    if isinstance(value, QuantTensor):
        return QuantTensor(value.data.to(device), value.scale.to(device), value.granularity, value.ue8m0,
                           value.element)
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def _target_device(device: str | torch.device | None) -> torch.device | None:
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ContractError(f"prepare_inputs: argument 'device' is {device!r}; expected a torch device such as "
                            f"'cpu' or 'cuda'. Fix: pass a valid device.") from exc
    if dev.type != "cpu":
        module = getattr(torch, dev.type, None)
        if module is None or not getattr(module, "is_available", lambda: False)():
            raise BackendUnavailableError(
                f"prepare_inputs: device {dev} is not available here (torch {torch.__version__} has no usable "
                f"{dev.type!r} device). Fix: prepare on a machine with that device, or pass backend=... without "
                f"device to prepare the bytes in emulation on CPU tensors.")
    return dev


@functools.lru_cache(maxsize=None)
def _parameters(fn: Callable[..., Any]) -> Any:
    """The public op's parameter names (inspect.signature costs ~60 µs a call; ops are few and fixed)."""
    return inspect.signature(fn).parameters


def prepare_inputs(op: str | Callable[..., Any], *, device: str | torch.device | None = None,
                   backend: str | None = None, arch: str | None = None, options: dict[str, Any] | None = None,
                   **tensors: Any) -> dict[str, Any]:
    """Return the op's arguments with every quantized one converted into the chosen backend's Format.

    op:      the op's name ("fp8_gemm_nt") or its public function (fp8_gemm_nt)
    device:  move the tensors there first (e.g. "cuda"); the backend follows from it
    backend: force a backend by name; on CPU tensors "nvidia"/"ascend" run in emulation
    arch:    option for backends with several formats (nvidia: "sm90" or "sm100")
    options: any other options the backend declares (e.g. {"soc": "950"} for ascend; see doctor)
    tensors: the op's arguments by name; quantized ones may be QuantTensors or (data, scale) tuples

    Returns a dict of the same names: quantized arguments become PreparedTensors holding their
    Format and backend; FP8 KV caches (the contract's cache_args, e.g. flash_mla_with_kvcache's
    k_cache) become PreparedKVCaches in the backend's KV-cache Format; the others are returned as
    given (moved to `device`). Converting scales
    that are not powers of two into an exponent-only Format raises LayoutError.
    """
    contract = get_contract(op)
    fn = public_function(contract)
    if fn is not None:
        params = _parameters(fn)
        unknown = [name for name in tensors if name not in params]
        if unknown:
            raise ContractError(f"prepare_inputs: {contract.name} has no argument {unknown[0]!r} "
                                f"(its arguments: {', '.join(params)}).")
    dev = _target_device(device)
    quant_names = {qa.name for qa in contract.quant_args}
    logical: dict[str, QuantTensor | PreparedTensor] = {}
    plain: dict[str, Any] = {}
    cache_formats = {}
    for name, value in tensors.items():
        if name in quant_names:
            logical[name] = _move(quant_operand(contract, name, value), dev)
        elif name in contract.cache_args:
            value, cache_formats[name] = cache_bytes(value)
            plain[name] = _move(value, dev)
        else:
            plain[name] = _move(value, dev)
    tags = {n: (v.backend, v.params) for n, v in logical.items() if isinstance(v, PreparedTensor)}
    involved = [v.data for v in logical.values()] + [v for v in plain.values() if isinstance(v, torch.Tensor)]
    chosen = dict(options or {})
    if arch is not None:
        chosen["arch"] = arch
    selection = select_backend(contract.name, common_device(contract.name, involved), tags, requested=backend,
                               options=chosen or None)
    prepared = {n: to_backend(contract, n, v, selection, implicit=False) for n, v in logical.items()}
    for name, have in cache_formats.items():
        plain[name] = prepare_kv_cache(plain[name], have, selection)
    return {**plain, **prepared}


def prepare_kv_cache(data: Any, have: Any, selection: Selection) -> Any:
    """A cache's bytes in `have`'s order -> a PreparedKVCache in `selection`'s KV-cache Format (once,
    not counted); a cache without a Format (a bf16 cache, have None) is returned as given."""
    if have is None:
        return data
    backend = selection.backend
    want = cache_format_for(backend, selection.options, have)
    return PreparedKVCache(to_cache_format(data, have, want), want, backend.name,
                           backend_params(backend, dict(selection.options)))
