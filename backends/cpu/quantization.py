"""cpu provider "reference" for the FP8 quantizers: the contract's torch math."""

from __future__ import annotations

import torch

from portable_kernels.quantization import quantize_blocks_reference
from portable_kernels.registry import Registry

from ._names import BACKEND, REFERENCE


def quantize(x: torch.Tensor, gran_mn: int, gran_k: int, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_blocks_reference(x, gran_mn, gran_k, use_ue8m0)


def register(registry: Registry) -> None:
    for op in ("per_token_cast_to_fp8", "per_block_cast_to_fp8"):
        registry.kernel(op, BACKEND, REFERENCE)(quantize)
