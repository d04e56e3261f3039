"""Provider "reference" of the cpu backend: every op by its contract's torch math (vectorized).

It reads the cpu layout (fp32 row-major scales) only; other backends' bytes never reach it.
"""

from __future__ import annotations

import torch

from portable_kernels.gemm import gemm_reference
from portable_kernels.quantization import dequantize_reference, quantize_blocks_reference
from portable_kernels.registry import Registry
from portable_kernels.tensors import QuantTensor

BACKEND = "cpu"
PROVIDER = "reference"


def quantize(x: torch.Tensor, gran_mn: int, gran_k: int, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_blocks_reference(x, gran_mn, gran_k, use_ue8m0)


def fp8_gemm_nt(a, sfa, b, sfb, d, c, sfa_format, sfb_format, sfa_granularity, sfb_granularity) -> None:
    if d.numel() == 0:
        return
    da = dequantize_reference(QuantTensor(a, sfa, sfa_granularity))
    db = dequantize_reference(QuantTensor(b, sfb, sfb_granularity))
    d.copy_(gemm_reference(da, db, c))


def bf16_gemm_nt(a, b, d, c) -> None:
    if d.numel() == 0:
        return
    d.copy_(gemm_reference(a, b, c))


def register(registry: Registry) -> None:
    for op in ("per_token_cast_to_fp8", "per_block_cast_to_fp8"):
        registry.kernel(op, BACKEND, PROVIDER)(quantize)
    registry.kernel("fp8_gemm_nt", BACKEND, PROVIDER)(fp8_gemm_nt)
    registry.kernel("bf16_gemm_nt", BACKEND, PROVIDER)(bf16_gemm_nt)
