"""An example third-party backend for portable_kernels.

It stands for a new chip whose GEMM wants the scales K-major-transposed ([sf_k, MN]) and runs, here,
in emulation on CPU tensors. It registers providers for the FP8 quantizers and fp8_gemm_nt only,
so the conformance report shows the other ops as unsupported.
"""

from __future__ import annotations

import torch

from portable_kernels.backend_api import (Backend, Decoded, Encoded, Format, PreparedTensor, QuantTensor, Registry,
                                       dequantize_reference, get_contract, register_reference)

NAME = "example"


def _encode(operand) -> Encoded:
    return Encoded(operand.data.contiguous(), operand.scale.transpose(-1, -2).contiguous(), tuple(operand.granularity))


def _decode(operand) -> Decoded:
    return Decoded(operand.data, operand.scale.transpose(-1, -2).contiguous(), tuple(operand.storage_granularity))


TRANSPOSED = Format("example-fp32-transposed", ("e4m3",), "fp32 [sf_k, MN], contiguous (K-major transposed)",
                    "as quantized", False, _encode, _decode, lambda granularity: tuple(granularity))


class ExampleBackend(Backend):
    name = NAME
    device_types = ()      # no real device in this example
    emulation = True       # runs on CPU tensors when chosen explicitly

    def format_for(self, op, arg, options):
        return TRANSPOSED

    def formats(self):
        return (TRANSPOSED,)


def _values(p: PreparedTensor) -> torch.Tensor:
    return dequantize_reference(QuantTensor(p.data, p.scale.T.contiguous(), p.storage_granularity))


def fp8_gemm_nt(call) -> None:
    if call.d.numel() == 0:
        return
    call.d.copy_(get_contract("fp8_gemm_nt").reference(_values(call.a), _values(call.b), call.c))


def register(registry: Registry) -> None:
    registry.add_backend(ExampleBackend())
    registry.kernel("fp8_gemm_nt", NAME, "emulated", formats={"a": (TRANSPOSED,), "b": (TRANSPOSED,)})(fp8_gemm_nt)
    for contract in (get_contract("per_token_cast_to_fp8"), get_contract("per_block_cast_to_fp8")):
        register_reference(registry, NAME, contract, name="emulated")
