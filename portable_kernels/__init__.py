"""portable_kernels: one math contract per op, native kernels per chip, bytes converted once.

Public API: quantization (per_token_cast_to_fp8, per_block_cast_to_fp8, dequantize), GEMM
(fp8_gemm_nt, bf16_gemm_nt), prepare_inputs, the registry (use_backend, available_backends),
strict layout mode and the implicit-conversion counter, the value types and the errors.
"""

from .contract import OpContract, QuantArg, Tolerance, contracts, get_contract
from .conversions import (ImplicitConversionWarning, implicit_conversions, reset_implicit_conversions,
                          strict_layouts)
from .errors import (BackendUnavailableError, ContractError, LayoutError, NoKernelError,
                     PortableKernelsError)
from .gemm import bf16_gemm_nt, fp8_gemm_nt
from .numerics import calc_diff
from .prepare import prepare_inputs
from .quantization import dequantize, per_block_cast_to_fp8, per_token_cast_to_fp8
from .registry import Backend, Provider, Registry, available_backends, registry, use_backend
from .tensors import LayoutTag, PreparedTensor, QuantTensor

__version__ = "0.1.0"

__all__ = [
    "Backend", "BackendUnavailableError", "ContractError", "ImplicitConversionWarning", "LayoutError",
    "LayoutTag", "NoKernelError", "OpContract", "PortableKernelsError", "PreparedTensor", "Provider",
    "QuantArg", "QuantTensor", "Registry", "Tolerance", "available_backends", "bf16_gemm_nt", "calc_diff",
    "contracts", "dequantize", "fp8_gemm_nt", "get_contract", "implicit_conversions", "per_block_cast_to_fp8",
    "per_token_cast_to_fp8", "prepare_inputs", "registry", "reset_implicit_conversions", "strict_layouts",
    "use_backend",
]
