"""Shared fixtures: an in-process emulation backend with an exponent-only layout ("testexp"), and
quick conformance reports computed once per session (several test modules inspect the same run)."""

from __future__ import annotations

import os

import pytest
from portable_kernels.backends.nvidia.kernels import runtime as _triton_runtime

# Triton in interpreter mode for the whole session, set here, before any test module is collected:
# the nvidia kernels decide compiled-vs-interpreted when their module is imported, which a test
# module that runs an op at collection would otherwise do first (tests/backends/nvidia/conftest.py)
os.environ[_triton_runtime.INTERPRET_ENV] = "1"
if _triton_runtime.triton_missing_reason() is None:  # imports triton if it is installed
    import triton

    triton.knobs.runtime.interpret = True  # held by the knob itself from now on, in this process only
os.environ.pop(_triton_runtime.INTERPRET_ENV, None)  # subprocesses start without it

from portable_kernels.layouts import ue8m0_exponents, ue8m0_to_fp32  # noqa: E402

import portable_kernels as pk  # noqa: E402
from portable_kernels.core.formats import Decoded, Encoded, Format  # noqa: E402
from portable_kernels.ops.gemm.dense import gemm_reference  # noqa: E402
from portable_kernels.core.oracle import register_reference  # noqa: E402
from portable_kernels.ops.quant.fp8 import PER_BLOCK_CAST, PER_TOKEN_CAST, dequantized  # noqa: E402

TEST_BACKEND = "testexp"


def _encode(qt) -> Encoded:
    return Encoded(qt.data.contiguous(), ue8m0_exponents(qt.scale), tuple(qt.granularity))


def _decode(p) -> Decoded:
    return Decoded(p.data, ue8m0_to_fp32(p.scale), tuple(p.storage_granularity))


#: scales as UE8M0 exponent bytes (uint8), so non-power-of-two scales are refused
EXPONENT_BYTES = Format("test-ue8m0-bytes", ("e4m3", "e2m1"), "uint8 exponents, row-major", "as quantized", True,
                        _encode, _decode, lambda g: tuple(g))


class ExponentBackend(pk.Backend):
    """Stores scales as UE8M0 exponent bytes (uint8), so it refuses non-power-of-two scales."""

    name = TEST_BACKEND
    device_types = ()
    emulation = True

    def format_for(self, op, arg, options):
        return EXPONENT_BYTES

    def formats(self):
        return (EXPONENT_BYTES,)


def _gemm(call) -> None:
    a, b = call.a, call.b
    da = dequantized(pk.PreparedTensor(a.data, ue8m0_to_fp32(a.scale), pk.PLAIN, a.backend, a.shape, a.granularity,
                                       a.storage_granularity, True, a.element))
    db = dequantized(pk.PreparedTensor(b.data, ue8m0_to_fp32(b.scale), pk.PLAIN, b.backend, b.shape, b.granularity,
                                       b.storage_granularity, True, b.element))
    call.d.copy_(gemm_reference(da, db, call.c))


def _register_test_backend() -> None:
    reg = pk.registry()
    if TEST_BACKEND in reg.backends():
        return
    reg.add_backend(ExponentBackend())
    reg.kernel("fp8_gemm_nt", TEST_BACKEND, "decode-reference", formats={"a": (EXPONENT_BYTES,), "b": (EXPONENT_BYTES,)})(
        _gemm)
    for contract in (PER_TOKEN_CAST, PER_BLOCK_CAST):
        register_reference(reg, TEST_BACKEND, contract)


@pytest.fixture(scope="session")
def exp_backend() -> str:
    """Name of a registered emulation backend whose layout stores UE8M0 exponent bytes."""
    _register_test_backend()
    return TEST_BACKEND


@pytest.fixture(autouse=True)
def _fresh_conversion_counter():
    pk.reset_implicit_conversions()
    yield


_REPORTS: dict = {}


@pytest.fixture(scope="session")
def conformance_report():
    """`get(backend, **options)`: the quick run_conformance of a backend, computed once per session."""
    from portable_kernels.testing import run_conformance

    def get(backend: str, **options):
        key = (backend, tuple(sorted(options.items())))
        if key not in _REPORTS:
            _REPORTS[key] = run_conformance(backend=backend, quick=True, **options)
        return _REPORTS[key]
    return get
