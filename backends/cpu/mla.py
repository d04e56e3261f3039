"""cpu provider "reference" for the MLA decode family: the contracts' reference kernels (the
contract math in fp32; no tile scheduler, so the metadata is the trivial one)."""

from __future__ import annotations

from portable_kernels.ops.attention.decode import FLASH_MLA_WITH_KVCACHE, GET_MLA_METADATA
from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    for contract in (GET_MLA_METADATA, FLASH_MLA_WITH_KVCACHE):
        register_reference(registry, BACKEND, contract)
