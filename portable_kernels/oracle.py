"""Layout oracles: a backend's "layout-reference" provider for any op.

The oracle decodes each quantized operand from the backend's own bytes (with the backend's
`decode`, i.e. its layouts) back to the logical form and runs the contract's reference kernel. It
proves a byte format carries the same math; it is a correctness tool, not a performance path.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .contract import KernelOperand, OpContract, contracts
from .layout import PLAIN_FORMAT
from .registry import Backend, Registry
from .tensors import LayoutTag, PreparedTensor

ORACLE_PROVIDER = "layout-reference"
#: oracles rank below every real kernel a backend registers
ORACLE_PRIORITY = -100


def _logical_shape(operand: KernelOperand, kwargs: dict[str, Any]) -> tuple[int, ...]:
    if operand.shape is not None:
        return tuple(operand.shape(kwargs))
    data: torch.Tensor = kwargs[operand.data]
    shape = tuple(data.shape)
    return (*shape[:-1], shape[-1] * 2) if data.dtype == torch.uint8 else shape


def layout_oracle(contract: OpContract, backend: Backend) -> Callable[..., Any]:
    """The contract's reference kernel behind a decode of `backend`'s bytes for every operand."""
    if contract.kernel is None:
        raise ValueError(f"contract {contract.name!r} has no reference kernel to build an oracle from")

    def oracle(**kwargs: Any) -> Any:
        for operand in contract.operands:
            granularity = kwargs[operand.granularity]
            tag = LayoutTag(backend.name, kwargs[operand.format], (("granularity", granularity),))
            data = kwargs[operand.data]
            element = "e2m1" if data.dtype == torch.uint8 else "e4m3"
            prepared = PreparedTensor(data, kwargs[operand.scale], tag, _logical_shape(operand, kwargs),
                                      granularity, element=element)
            logical = backend.decode(prepared)
            kwargs.update({operand.data: logical.data, operand.scale: logical.scale,
                           operand.format: PLAIN_FORMAT, operand.granularity: logical.granularity})
        return contract.kernel(**kwargs)

    oracle.__name__ = f"{contract.name}_layout_oracle"
    oracle.__doc__ = f"{contract.name} on {backend.name}'s bytes, decoded by its layouts (correctness oracle)."
    return oracle


def register_oracles(registry: Registry, backend: Backend) -> None:
    """Register `backend`'s layout oracle for every op whose contract has a reference kernel."""
    for contract in contracts().values():
        if contract.kernel is not None:
            registry.kernel(contract.name, backend.name, ORACLE_PROVIDER, priority=ORACLE_PRIORITY)(
                layout_oracle(contract, backend))
