"""cpu provider "reference" for the prefill attention family: the contracts' reference kernels
(fp32 math; sparse prefill chunked over query tokens, varlen sequence by sequence)."""

from __future__ import annotations

from portable_kernels.ops.attention.prefill import FLASH_ATTN_VARLEN, FLASH_MLA_SPARSE_FWD
from portable_kernels.core.oracle import register_reference
from portable_kernels.core.registry import Registry

from ._names import BACKEND


def register(registry: Registry) -> None:
    for contract in (FLASH_MLA_SPARSE_FWD, FLASH_ATTN_VARLEN):
        register_reference(registry, BACKEND, contract)
