"""portable_kernels: one math contract per op, native kernels per chip, bytes converted once.

Public API: quantization (per_token_cast_to_fp8, per_block_cast_to_fp8, dequantize), GEMM
(fp8_gemm_nt, bf16_gemm_nt), prepare_inputs, the registry (use_backend, available_backends),
strict layout mode and the implicit-conversion counter, the value types and the errors.
"""

from .attention import flash_attn_varlen_func, flash_mla_sparse_fwd
from .block_cast import block_cast
from .contiguous_layout import set_mk_alignment_for_contiguous_layout
from .contract import OpContract, QuantArg, Tolerance, contracts, get_contract
from .conversions import (ImplicitConversionWarning, count_implicit_conversions, implicit_conversions,
                          reset_implicit_conversions, strict_layouts)
from .ep import (CombineResult, DispatchHandle, DispatchResult, LowLatencyDispatchResult, LowLatencyHandle,
                 get_dispatch_layout, simulate_combine, simulate_dispatch, simulate_low_latency_combine,
                 simulate_low_latency_dispatch)
from .errors import (BackendUnavailableError, ContractError, EPTimeoutError, LayoutError, NoKernelError,
                     PortableKernelsError)
from .formats import PLAIN, Format
from .fp4 import fp8_fp4_gemm_nt, per_token_cast_to_fp4, swiglu_forward_and_per_token_cast
from .gemm import bf16_gemm_nt, fp8_gemm_nt
from .gemm_transposed import bf16_gemm_nn, bf16_gemm_tn, bf16_gemm_tt, fp8_gemm_nn, fp8_gemm_tn, fp8_gemm_tt
from .grouped_fp4 import m_grouped_fp8_fp4_gemm_nt_contiguous, m_grouped_fp8_fp4_gemm_nt_masked
from .grouped_gemm import (get_m_alignment_for_contiguous_layout, get_mk_alignment_for_contiguous_layout, m_grouped_bf16_gemm_nt_contiguous,
                           m_grouped_bf16_gemm_nt_masked, m_grouped_fp8_gemm_nt_contiguous,
                           m_grouped_fp8_gemm_nt_masked)
from .k_grouped_gemm import (k_grouped_bf16_gemm_tn_contiguous, k_grouped_fp8_gemm_nt_contiguous,
                             k_grouped_fp8_gemm_tn_contiguous)
from .mla import MlaMetadata, flash_mla_with_kvcache, get_mla_metadata
from .moe_routing import (FusedMapping, aux_fi, expand_to_fused, expand_to_fused_with_sf, get_fused_mapping, group_count,
                          inplace_unique_group_indices, map_to_physical_experts, mask_indices_by_tp, normalize_weight,
                          reduce_fused, top2_sum_gate, topk_gate, topk_sum_and_topk_group_idx)
from .numerics import calc_diff
from .prepare import prepare_inputs
from .providers import Inputs, Limit, Provider
from .quantization import dequantize, per_block_cast_to_fp8, per_channel_cast_to_fp8, per_token_cast_to_fp8
from .registry import Backend, Registry, available_backends, registry, use_backend
from .swiglu import swiglu_forward
from .tensors import LayoutTag, PreparedTensor, QuantTensor
from .topk import topk
from . import torch_ops  # noqa: E402, F401  defines torch.ops.portable_kernels.* (after every op module)

__version__ = "0.1.0"

__all__ = [
    "CombineResult", "DispatchHandle", "DispatchResult", "LowLatencyDispatchResult", "LowLatencyHandle",
    "get_dispatch_layout", "simulate_combine", "simulate_dispatch", "simulate_low_latency_combine",
    "simulate_low_latency_dispatch",
    "FusedMapping", "expand_to_fused", "expand_to_fused_with_sf", "get_fused_mapping", "normalize_weight",
    "reduce_fused", "top2_sum_gate", "topk",
    "aux_fi", "group_count", "inplace_unique_group_indices", "map_to_physical_experts", "mask_indices_by_tp",
    "topk_gate", "topk_sum_and_topk_group_idx", "block_cast", "swiglu_forward",
    "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
    "fp8_fp4_gemm_nt", "per_token_cast_to_fp4", "swiglu_forward_and_per_token_cast",
    "get_m_alignment_for_contiguous_layout", "get_mk_alignment_for_contiguous_layout",
    "set_mk_alignment_for_contiguous_layout", "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_masked",
    "k_grouped_bf16_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous",
    "MlaMetadata", "flash_mla_with_kvcache", "get_mla_metadata", "flash_attn_varlen_func", "flash_mla_sparse_fwd",
    "Backend", "BackendUnavailableError", "EPTimeoutError", "Format", "Inputs", "Limit", "PLAIN", "ContractError", "ImplicitConversionWarning", "LayoutError",
    "LayoutTag", "NoKernelError", "OpContract", "PortableKernelsError", "PreparedTensor", "Provider",
    "QuantArg", "QuantTensor", "Registry", "Tolerance", "available_backends", "bf16_gemm_nt", "calc_diff",
    "contracts", "count_implicit_conversions", "dequantize", "fp8_gemm_nt", "get_contract", "implicit_conversions",
    "per_block_cast_to_fp8", "per_channel_cast_to_fp8", "per_token_cast_to_fp8", "prepare_inputs", "registry",
    "reset_implicit_conversions", "strict_layouts",
    "use_backend",
]
