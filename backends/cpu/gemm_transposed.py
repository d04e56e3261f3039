"""cpu provider "reference" for the nn / tn / tt GEMMs: the contracts' reference kernels (the nt
math on the transposed views the ops bind)."""

from __future__ import annotations

from portable_kernels.ops.gemm.transposed import BF16_CONTRACTS, FP8_CONTRACTS
from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    for contract in (*FP8_CONTRACTS.values(), *BF16_CONTRACTS.values()):
        register_reference(registry, BACKEND, contract)
