"""An example third-party backend for portable_kernels.

It stands for a new chip whose GEMM wants the weight scales K-major-transposed ([sf_k, MN]) and
runs, here, in emulation on CPU tensors. It registers providers for the FP8 quantizers and
fp8_gemm_nt only, so the conformance report shows the other ops as unsupported.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from portable_kernels import Backend, PreparedTensor, QuantTensor, Registry
from portable_kernels.gemm import gemm_reference
from portable_kernels.layout import Layout
from portable_kernels.quantization import dequantize_reference, quantize_blocks_reference

NAME = "example"
TRANSPOSED = "fp32-transposed"


def _encode(qt: QuantTensor):
    return qt.data.contiguous(), qt.scale.transpose(-1, -2).contiguous(), qt.granularity


def _decode(p: PreparedTensor) -> QuantTensor:
    return QuantTensor(p.data, p.scale.transpose(-1, -2).contiguous(), p.storage_granularity, p.ue8m0, p.element)


class ExampleBackend(Backend):
    name = NAME
    device_types = ()      # no real device in this example
    emulation = True       # runs on CPU tensors when chosen explicitly

    def __init__(self) -> None:
        self._layout = Layout(TRANSPOSED, _encode, _decode)

    def layout_for(self, op: str, arg: str, role: str, options: Mapping[str, Any]) -> Layout:
        return self._layout

    def decode(self, prepared: PreparedTensor) -> QuantTensor:
        return _decode(prepared)


def fp8_gemm_nt(a, sfa, b, sfb, d, c, sfa_format, sfb_format, sfa_granularity, sfb_granularity) -> None:
    if d.numel() == 0:
        return
    da = dequantize_reference(QuantTensor(a, sfa.T.contiguous(), sfa_granularity))
    db = dequantize_reference(QuantTensor(b, sfb.T.contiguous(), sfb_granularity))
    d.copy_(gemm_reference(da, db, c))


def supports_gemm(a, sfa, b, sfb, d, c, sfa_format, sfb_format, sfa_granularity, sfb_granularity) -> str | None:
    if sfa_format != TRANSPOSED or sfb_format != TRANSPOSED:
        return f"reads {TRANSPOSED} scales only, got {sfa_format}/{sfb_format}"
    return None


def quantize(x: torch.Tensor, gran_mn: int, gran_k: int, use_ue8m0: bool):
    return quantize_blocks_reference(x, gran_mn, gran_k, use_ue8m0)


def register(registry: Registry) -> None:
    registry.add_backend(ExampleBackend())
    registry.kernel("fp8_gemm_nt", NAME, "emulated", supports=supports_gemm)(fp8_gemm_nt)
    for op in ("per_token_cast_to_fp8", "per_block_cast_to_fp8"):
        registry.kernel(op, NAME, "emulated")(quantize)
