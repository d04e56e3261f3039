"""portable_kernels: one math contract per op, native kernels per chip, bytes converted once.

Public API: quantization (per_token_cast_to_fp8, per_block_cast_to_fp8, dequantize), GEMM
(fp8_gemm_nt, bf16_gemm_nt), prepare_inputs, the registry (use_backend, available_backends),
strict layout mode and the implicit-conversion counter, the value types and the errors.
"""

import sys

from .ops.attention.prefill import flash_attn_varlen_func, flash_mla_sparse_fwd
from .ops.quant.block_cast import block_cast
from .ops.quant.e5m6 import per_token_cast_to_e5m6
from .ops.quant.lossless import per_block_cast_lossless
from .ops.swiglu_backward import swiglu_backward_and_per_token_cast
from .core.alignment import (get_m_alignment_for_contiguous_layout, get_mk_alignment_for_contiguous_layout,
                             set_mk_alignment_for_contiguous_layout)
from .core.contract import OpContract, QuantArg, Tolerance, contracts, get_contract
from .core.conversions import (ImplicitConversionWarning, count_implicit_conversions, implicit_conversions,
                          reset_implicit_conversions, strict_layouts)
from .ops.ep import (CombineResult, DispatchHandle, DispatchResult, LowLatencyDispatchResult, LowLatencyHandle,
                 get_dispatch_layout, simulate_combine, simulate_dispatch, simulate_low_latency_combine,
                 simulate_low_latency_dispatch)
from .core.errors import (BackendUnavailableError, ContractError, EPTimeoutError, LayoutError, NoKernelError,
                     PortableKernelsError)
from .core.formats import PLAIN, Format
from .ops.quant.fp4 import per_token_cast_to_fp4
from .ops.gemm.fp4 import fp8_fp4_gemm_nt
from .ops.swiglu import swiglu_forward_and_per_token_cast
from .ops.gemm.dense import bf16_gemm_nt, fp8_gemm_nt
from .ops.gemm.transposed import bf16_gemm_nn, bf16_gemm_tn, bf16_gemm_tt, fp8_gemm_nn, fp8_gemm_tn, fp8_gemm_tt
from .ops.gemm.grouped_fp4 import m_grouped_fp8_fp4_gemm_nt_contiguous, m_grouped_fp8_fp4_gemm_nt_masked
from .ops.gemm.grouped import (m_grouped_bf16_gemm_nt_contiguous,
                           m_grouped_bf16_gemm_nt_masked, m_grouped_fp8_gemm_nt_contiguous,
                           m_grouped_fp8_gemm_nt_masked)
from .ops.gemm.k_grouped import (k_grouped_bf16_gemm_tn_contiguous, k_grouped_fp8_gemm_nt_contiguous,
                             k_grouped_fp8_gemm_tn_contiguous)
from .ops.gemm.hc_prenorm import tf32_hc_prenorm_gemm
from .ops.attention.decode import MlaMetadata, flash_mla_with_kvcache, get_mla_metadata
from .ops.attention.kv_cache import PreparedKVCache, allocate_kv_cache, write_kv_cache
from .ops.attention.indexer import fp8_mqa_logits, fp8_paged_mqa_logits, get_paged_mqa_logits_metadata
from .ops.moe_routing import (FusedMapping, aux_fi, expand_to_fused, expand_to_fused_with_sf, get_fused_mapping, group_count,
                          inplace_unique_group_indices, map_to_physical_experts, mask_indices_by_tp, normalize_weight,
                          reduce_fused, top2_sum_gate, topk_gate, topk_sum_and_topk_group_idx)
from .core.numerics import calc_diff
from .core.prepare import prepare_inputs
from .core.providers import Inputs, Limit, Provider
from .ops.quant.fp8 import dequantize, per_block_cast_to_fp8, per_channel_cast_to_fp8, per_token_cast_to_fp8
from .core.registry import Backend, Registry, available_backends, registry, use_backend
from .ops.swiglu import swiglu_forward
from .core.tensors import LayoutTag, PreparedTensor, QuantTensor
from .ops.topk import topk
from . import torch_ops  # noqa: E402, F401  defines torch.ops.portable_kernels.* (after every op module)
from .core import moved as _moved

_moved.install()  # old internal paths (portable_kernels.gemm, ...) for one release
from .ops import ep  # noqa: E402, F401  the documented `portable_kernels.ep.Buffer`


def __getattr__(name: str):
    """`pk.gemm`, `pk.registry`, ...: the modules that lived here before core/ and ops/ (deprecated)."""
    return _moved.old_attribute(sys.modules[__name__], name)

__version__ = "0.1.0"

__all__ = [
    "CombineResult", "DispatchHandle", "DispatchResult", "LowLatencyDispatchResult", "LowLatencyHandle",
    "get_dispatch_layout", "simulate_combine", "simulate_dispatch", "simulate_low_latency_combine",
    "simulate_low_latency_dispatch",
    "FusedMapping", "expand_to_fused", "expand_to_fused_with_sf", "get_fused_mapping", "normalize_weight",
    "reduce_fused", "top2_sum_gate", "topk",
    "aux_fi", "group_count", "inplace_unique_group_indices", "map_to_physical_experts", "mask_indices_by_tp",
    "topk_gate", "topk_sum_and_topk_group_idx", "block_cast", "per_token_cast_to_e5m6", "per_block_cast_lossless",
    "swiglu_backward_and_per_token_cast", "swiglu_forward",
    "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
    "fp8_fp4_gemm_nt", "per_token_cast_to_fp4", "swiglu_forward_and_per_token_cast", "tf32_hc_prenorm_gemm",
    "get_m_alignment_for_contiguous_layout", "get_mk_alignment_for_contiguous_layout",
    "set_mk_alignment_for_contiguous_layout", "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_masked",
    "k_grouped_bf16_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous",
    "MlaMetadata", "PreparedKVCache", "allocate_kv_cache", "write_kv_cache", "flash_mla_with_kvcache", "fp8_mqa_logits", "fp8_paged_mqa_logits", "get_paged_mqa_logits_metadata", "get_mla_metadata", "flash_attn_varlen_func", "flash_mla_sparse_fwd",
    "Backend", "BackendUnavailableError", "EPTimeoutError", "Format", "Inputs", "Limit", "PLAIN", "ContractError", "ImplicitConversionWarning", "LayoutError",
    "LayoutTag", "NoKernelError", "OpContract", "PortableKernelsError", "PreparedTensor", "Provider",
    "QuantArg", "QuantTensor", "Registry", "Tolerance", "available_backends", "bf16_gemm_nt", "calc_diff",
    "contracts", "count_implicit_conversions", "dequantize", "fp8_gemm_nt", "get_contract", "implicit_conversions",
    "per_block_cast_to_fp8", "per_channel_cast_to_fp8", "per_token_cast_to_fp8", "prepare_inputs", "registry",
    "reset_implicit_conversions", "strict_layouts",
    "use_backend",
]
