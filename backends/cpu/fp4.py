"""cpu provider "reference" for the FP4 family and the fused SwiGLU quantizer: the contracts'
torch math (cpu layout: fp32 row-major scales, packed E2M1 bytes as they are)."""

from __future__ import annotations

from portable_kernels.fp4 import (quantize_fp4_reference, swiglu_clamp_counts,
                                  swiglu_forward_and_per_token_cast_reference, swiglu_rows)
from portable_kernels.gemm import gemm_reference
from portable_kernels.quantization import dequantize_reference
from portable_kernels.registry import Registry
from portable_kernels.tensors import QuantTensor

from ._names import BACKEND, REFERENCE


def per_token_cast_to_fp4(x, gran_k, use_ue8m0):
    return quantize_fp4_reference(x, gran_k, use_ue8m0)


def fp8_fp4_gemm_nt(a, sfa, b, sfb, d, c, sfa_format, sfb_format, sfa_granularity, sfb_granularity) -> None:
    if d.numel() == 0:
        return
    da = dequantize_reference(QuantTensor(a, sfa, sfa_granularity))
    db = dequantize_reference(QuantTensor(b, sfb, sfb_granularity, element="e2m1"))
    d.copy_(gemm_reference(da, db, c))


def swiglu_forward_and_per_token_cast(x, num_per_channels, round_sf, pos_to_token_topk, topk_weights, pos_to_expert,
                                      swiglu_clamp_value, clamped_count):
    if clamped_count is not None:
        valid, _ = swiglu_rows(x.shape[0], pos_to_token_topk, topk_weights, pos_to_expert, x.device)
        clamped_count += swiglu_clamp_counts(x, valid, swiglu_clamp_value)
    return swiglu_forward_and_per_token_cast_reference(x, num_per_channels, round_sf, pos_to_token_topk,
                                                       topk_weights, pos_to_expert, swiglu_clamp_value)


def register(registry: Registry) -> None:
    for fn in (per_token_cast_to_fp4, fp8_fp4_gemm_nt, swiglu_forward_and_per_token_cast):
        registry.kernel(fn.__name__, BACKEND, REFERENCE)(fn)
