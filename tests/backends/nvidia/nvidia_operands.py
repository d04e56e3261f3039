"""Operands in the nvidia formats for the kernel tests, built with the layouts (no backend code)."""

from __future__ import annotations

import torch

from portable_kernels.layouts import sm100_ue8m0_encode, sm100_ue8m0_encode_from_blocks, sm90_sfa_encode
from portable_kernels.ops.quant.fp8 import dequantize_reference, quantize_blocks_reference
from portable_kernels.core.tensors import QuantTensor
from portable_kernels.testing.generators import randn

#: storage forms a kernel must read: plain fp32 row-major, sm90 (fp32 MN-major / SFB as is), sm100 words
FORMS = ("plain", "sm90", "sm100")


def quantized(shape: tuple[int, ...], granularity: tuple[int, int], ue8m0: bool, seed: int,
              scale: float = 1.0) -> QuantTensor:
    x = randn(*shape, seed=seed, scale=scale)
    data, sf = quantize_blocks_reference(x, granularity[0], granularity[1], ue8m0)
    return QuantTensor(data, sf, granularity, ue8m0)


def storage(q: QuantTensor, form: str) -> tuple[torch.Tensor, tuple[int, int]]:
    """(scale storage, the granularity it carries) of `q` in `form`."""
    gm, gk = q.granularity
    if form == "plain":
        return q.scale.contiguous(), q.granularity
    if form == "sm90":
        return (sm90_sfa_encode(q.scale) if gm == 1 else q.scale.contiguous()), q.granularity
    rows = q.shape[-2]
    if gm == 1:
        return sm100_ue8m0_encode(q.scale), (1, gk)
    return sm100_ue8m0_encode_from_blocks(q.scale, rows, gm), (1, gk)


def dequantized(q: QuantTensor) -> torch.Tensor:
    return dequantize_reference(q).double()
