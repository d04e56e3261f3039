"""Reference providers: the contracts' reference kernels registered as providers.

- `register_reference`: a contract's reference kernel as a backend's provider for operands in the
  PLAIN format (the cpu backend's "reference").
- `register_references`: that, for every contract with a reference kernel (the cpu backend).
- `register_oracles`: every backend's "layout-reference" provider at the lowest priority: it
  decodes each prepared operand from the backend's own Format (`inputs.decoded()`, i.e. the
  Format's decode) and runs the contract's reference kernel. It proves a byte format carries the
  same math; it is a correctness tool, never a performance path.
"""

from __future__ import annotations

from typing import Any, Callable

from .contract import OpContract, contracts
from .formats import PLAIN, Format
from .registry import Backend, Registry

ORACLE_PROVIDER = "layout-reference"
#: oracles rank below every real kernel a backend registers
ORACLE_PRIORITY = -100
REFERENCE_PROVIDER = "reference"


def reference_formats(contract: OpContract) -> dict[str, tuple[Format, ...]]:
    """What the reference kernel reads and writes: PLAIN operands, plus its declared output limits."""
    return {**{qa.name: (PLAIN,) for qa in contract.quant_args}, **contract.kernel_formats}


def register_reference(registry: Registry, backend: str, contract: OpContract, name: str = REFERENCE_PROVIDER,
                       priority: int = 0) -> None:
    """Register `contract`'s reference kernel as `backend`'s provider `name` (PLAIN operands)."""
    if contract.kernel is None:
        raise ValueError(f"contract {contract.name!r} has no reference kernel")
    registry.kernel(contract.name, backend, name, priority=priority, formats=reference_formats(contract),
                    doc="the contract's torch math")(contract.kernel)


def register_references(registry: Registry, backend: str) -> None:
    """Register the reference kernel of every contract that has one as `backend`'s provider
    "reference" (PLAIN operands): the whole of a backend whose bytes are the logical ones."""
    for contract in contracts().values():
        if contract.kernel is not None:
            register_reference(registry, backend, contract)


def layout_oracle(contract: OpContract) -> Callable[[Any], Any]:
    """The contract's reference kernel behind a decode of every prepared operand's Format."""
    if contract.kernel is None:
        raise ValueError(f"contract {contract.name!r} has no reference kernel to build an oracle from")
    kernel = contract.kernel
    if not contract.quant_args:
        return kernel

    def oracle(call: Any) -> Any:
        return kernel(call.decoded())

    oracle.__name__ = f"{contract.name}_layout_oracle"
    oracle.__doc__ = f"{contract.name} on a backend's own bytes, decoded by their Formats (correctness oracle)."
    return oracle


def register_oracles(registry: Registry, backend: Backend) -> None:
    """Register `backend`'s layout oracle for every op whose contract has a reference kernel."""
    for contract in contracts().values():
        if contract.kernel is not None:
            registry.kernel(contract.name, backend.name, ORACLE_PROVIDER, priority=ORACLE_PRIORITY,
                            formats=dict(contract.kernel_formats),
                            doc="decodes its Formats, then the contract's torch math (correctness oracle, not fast)"
                            )(layout_oracle(contract))
