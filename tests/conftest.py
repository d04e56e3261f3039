"""Shared fixtures: an in-process emulation backend with an exponent-only layout ("testexp")."""

from __future__ import annotations

from typing import Any, Mapping

import pytest
import torch

import portable_kernels as pk
from portable_kernels.gemm import gemm_reference
from portable_kernels.layout import Layout
from portable_kernels.layouts import ue8m0_exponents, ue8m0_to_fp32
from portable_kernels.quantization import dequantize_reference, quantize_blocks_reference

TEST_BACKEND = "testexp"


class ExponentBackend(pk.Backend):
    """Stores scales as UE8M0 exponent bytes (uint8), so it refuses non-power-of-two scales."""

    name = TEST_BACKEND
    device_types = ()
    emulation = True

    def __init__(self) -> None:
        def encode(qt: pk.QuantTensor):
            return qt.data.contiguous(), ue8m0_exponents(qt.scale), qt.granularity

        self.layout = Layout("ue8m0-bytes", encode, self.decode, requires_ue8m0=True)

    def layout_for(self, op: str, arg: str, role: str, options: Mapping[str, Any]) -> Layout:
        return self.layout

    def decode(self, p: pk.PreparedTensor) -> pk.QuantTensor:
        return pk.QuantTensor(p.data, ue8m0_to_fp32(p.scale), p.storage_granularity, True, p.element)


def _gemm(a, sfa, b, sfb, d, c, sfa_format, sfb_format, sfa_granularity, sfb_granularity):
    da = dequantize_reference(pk.QuantTensor(a, ue8m0_to_fp32(sfa), sfa_granularity, True))
    db = dequantize_reference(pk.QuantTensor(b, ue8m0_to_fp32(sfb), sfb_granularity, True))
    d.copy_(gemm_reference(da, db, c))


def _register_test_backend() -> None:
    reg = pk.registry()
    if TEST_BACKEND in reg.backends():
        return
    reg.add_backend(ExponentBackend())
    reg.kernel("fp8_gemm_nt", TEST_BACKEND, "decode-reference")(_gemm)
    for op in ("per_token_cast_to_fp8", "per_block_cast_to_fp8"):
        reg.kernel(op, TEST_BACKEND, "reference")(quantize_blocks_reference)


@pytest.fixture(scope="session")
def exp_backend() -> str:
    """Name of a registered emulation backend whose layout stores UE8M0 exponent bytes."""
    _register_test_backend()
    return TEST_BACKEND


@pytest.fixture(autouse=True)
def _fresh_conversion_counter():
    pk.reset_implicit_conversions()
    yield
