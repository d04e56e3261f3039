"""`prepare_inputs`: convert an op's arguments once, at ingest, into a backend's native bytes."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from .contract import public_function, get_contract, quant_operand, to_backend
from .errors import ContractError
from .registry import select_backend
from .tensors import PreparedTensor, QuantTensor


def _move(value: Any, device: torch.device | None) -> Any:
    if device is None:
        return value
    if isinstance(value, QuantTensor):
        return QuantTensor(value.data.to(device), value.scale.to(device), value.granularity, value.ue8m0,
                           value.element)
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def prepare_inputs(op: str | Callable[..., Any], *, device: str | torch.device | None = None,
                   backend: str | None = None, arch: str | None = None, **tensors: Any) -> dict[str, Any]:
    """Return the op's arguments with every quantized one converted into the chosen backend's layout.

    op:      the op's name ("fp8_gemm_nt") or its public function (fp8_gemm_nt)
    device:  move the tensors there first (e.g. "cuda"); the backend follows from it
    backend: force a backend by name; on CPU tensors "nvidia"/"ascend" run in emulation
    arch:    layout option for backends with several formats (nvidia: "sm90" or "sm100")
    tensors: the op's arguments by name; quantized ones may be QuantTensors or (data, scale) tuples

    Returns a dict of the same names: quantized arguments become PreparedTensors tagged with
    (backend, layout); the others are returned as given (moved to `device`). Converting scales
    that are not powers of two into an exponent-only layout raises LayoutError.
    """
    contract = get_contract(op)
    fn = public_function(contract)
    if fn is not None:
        params = inspect.signature(fn).parameters
        unknown = [name for name in tensors if name not in params]
        if unknown:
            raise ContractError(f"prepare_inputs: {contract.name} has no argument {unknown[0]!r} "
                                f"(its arguments: {', '.join(params)}).")
    dev = torch.device(device) if device is not None else None
    quant_names = {qa.name for qa in contract.quant_args}
    logical: dict[str, QuantTensor | PreparedTensor] = {}
    plain: dict[str, Any] = {}
    for name, value in tensors.items():
        if name in quant_names:
            logical[name] = _move(quant_operand(contract, name, value), dev)
        else:
            plain[name] = _move(value, dev)
    tags = {n: v.tag.backend for n, v in logical.items() if isinstance(v, PreparedTensor)}
    involved = [v.data for v in logical.values()] + [v for v in plain.values() if isinstance(v, torch.Tensor)]
    selection = select_backend(contract.name, involved, tags, requested=backend,
                               options={"arch": arch} if arch is not None else None)
    prepared = {n: to_backend(contract, n, v, selection, implicit=False) for n, v in logical.items()}
    return {**plain, **prepared}
