"""The one module a backend author imports (docs/adding-a-backend.md): what a plugin registers
with, what its providers receive, and the shared checks and references it may build on. Its names
are stable across releases; the modules they live in (core/, ops/) may move.
"""

from __future__ import annotations

from .core.checks import check_device, check_int, check_tensor, checks_values, contiguous, fail, inner_contiguous
from .core.contract import OpContract, QuantArg, Tolerance, contracts, get_contract
from .core.dispatch import trace_providers
from .core.errors import BackendUnavailableError, ContractError, LayoutError, NoKernelError, format_problem
from .core.formats import PLAIN, Decoded, Encoded, Format
from .core.oracle import register_oracles, register_reference, register_references
from .core.providers import Inputs, Limit, Provider
from .core.registry import Backend, EpEngine, Registry
from .core.tensors import PreparedTensor, QuantTensor
from .ops.attention.decode import MlaDecodeInputs, MlaMetadataInputs
from .ops.attention.prefill import SparsePrefillInputs, VarlenInputs
from .ops.gemm.dense import GemmInputs
from .ops.gemm.grouped import ContiguousGroupedInputs, MaskedGroupedInputs
from .ops.gemm.k_grouped import KGroupedInputs
from .ops.quant.fp8 import CastInputs, dequantize_reference, dequantized
from .ops.swiglu import SwigluCastInputs, SwigluForwardInputs
from .ops.topk import TopkInputs

__all__ = [
    # registering
    "Backend", "EpEngine", "Registry", "Provider", "Limit", "register_oracles", "register_reference",
    "register_references",
    # byte formats and operands
    "Format", "Encoded", "Decoded", "PLAIN", "PreparedTensor", "QuantTensor", "dequantized", "dequantize_reference",
    # contracts (each op's reference math: get_contract(name).reference, its reference kernel: .kernel)
    "OpContract", "QuantArg", "Tolerance", "contracts", "get_contract",
    # the inputs values providers receive
    "Inputs", "GemmInputs", "ContiguousGroupedInputs", "MaskedGroupedInputs", "KGroupedInputs", "CastInputs",
    "SwigluCastInputs", "SwigluForwardInputs", "TopkInputs", "MlaDecodeInputs", "MlaMetadataInputs",
    "SparsePrefillInputs", "VarlenInputs",
    # checks a kernel re-runs before a native pointer read, and the errors they raise
    "check_device", "check_int", "check_tensor", "checks_values", "contiguous", "fail", "inner_contiguous",
    "format_problem", "ContractError", "LayoutError", "NoKernelError", "BackendUnavailableError",
    "trace_providers",
]
