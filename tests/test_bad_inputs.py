"""Bad-input catalogue for the foundation's public functions: each gives a typed error naming the
argument (never a crash or a silent wrong answer)."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.testing.generators import randn

A = pk.per_token_cast_to_fp8(randn(4, 256, seed=1))
B = pk.per_block_cast_to_fp8(randn(8, 256, seed=2))
D = torch.empty(4, 8, dtype=torch.bfloat16)


def _other_k():
    return pk.per_block_cast_to_fp8(randn(8, 384, seed=3))


FP8_GEMM_CASES = {
    "a is a plain tensor": (lambda: (randn(4, 256, seed=0), B, D, None), "'a'"),
    "a data not fp8": (lambda: ((A.data.float(), A.scale), B, D, None), "'a'"),
    "a scale wrong shape": (lambda: ((A.data, torch.ones(4, 5)), B, D, None), "'a'"),
    "a scale packed int32": (lambda: ((A.data, A.scale.view(torch.int32)), B, D, None), "'a'"),
    "b not a pair": (lambda: (A, (B.data,), D, None), "'b'"),
    "mismatched K": (lambda: (A, _other_k(), D, None), "'b'"),
    "d wrong dtype": (lambda: (A, B, torch.empty(4, 8, dtype=torch.float16), None), "'d'"),
    "d wrong shape": (lambda: (A, B, torch.empty(4, 9, dtype=torch.bfloat16), None), "'d'"),
    "d not contiguous": (lambda: (A, B, torch.empty(8, 4, dtype=torch.bfloat16).T, None), "'d'"),
    "d on another device": (lambda: (A, B, torch.empty(4, 8, dtype=torch.bfloat16, device="meta"), None), "'d'"),
    "c wrong shape": (lambda: (A, B, D, torch.zeros(4, 9)), "'c'"),
    "3-D operand": (lambda: (pk.per_token_cast_to_fp8(randn(2, 4, 256, seed=4)), B, D, None), "'a'"),
}


@pytest.mark.parametrize("name", list(FP8_GEMM_CASES))
def test_fp8_gemm_nt_bad_input(name):
    build, arg = FP8_GEMM_CASES[name]
    a, b, d, c = build()
    with pytest.raises(pk.ContractError, match=arg):
        pk.fp8_gemm_nt(a, b, d, c=c)


def test_fp8_gemm_nt_k_zero_is_refused():
    a = pk.QuantTensor(torch.empty(4, 0, dtype=torch.float8_e4m3fn), torch.empty(4, 0), (1, 128))
    b = pk.QuantTensor(torch.empty(8, 0, dtype=torch.float8_e4m3fn), torch.empty(1, 0), (128, 128))
    with pytest.raises(pk.ContractError, match="K >= 1"):
        pk.fp8_gemm_nt(a, b, D)


def test_fp8_gemm_nt_mismatched_k_granularity_is_refused():
    a = pk.per_token_cast_to_fp8(randn(4, 256, seed=5), gran_k=64)
    with pytest.raises(pk.ContractError, match="granularity"):
        pk.fp8_gemm_nt(a, B, D)


BF16_CASES = {
    "a fp32": (lambda: (randn(4, 16, seed=0), randn(8, 16, seed=1).bfloat16(), D), "'a'"),
    "b 1-D": (lambda: (randn(4, 16, seed=0).bfloat16(), randn(16, seed=1).bfloat16(), D), "'b'"),
    "mismatched K": (lambda: (randn(4, 16, seed=0).bfloat16(), randn(8, 17, seed=1).bfloat16(), D), "'b'"),
    "d wrong shape": (lambda: (randn(4, 16, seed=0).bfloat16(), randn(8, 16, seed=1).bfloat16(),
                               torch.empty(3, 8)), "'d'"),
}


@pytest.mark.parametrize("name", list(BF16_CASES))
def test_bf16_gemm_nt_bad_input(name):
    build, arg = BF16_CASES[name]
    a, b, d = build()
    with pytest.raises(pk.ContractError, match=arg):
        pk.bf16_gemm_nt(a, b, d)


@pytest.mark.parametrize("kwargs,arg", [
    (dict(x=torch.ones(4, 8, dtype=torch.int32)), "'x'"),
    (dict(x=torch.ones(8)), "'x'"),
    (dict(x=torch.ones(4, 8), gran_k=0), "'gran_k'"),
    (dict(x=torch.ones(4, 8), gran_k=True), "'gran_k'"),
    (dict(x=torch.ones(4, 8), use_ue8m0="yes"), "'use_ue8m0'"),
    (dict(x=[[1.0]]), "'x'"),
])
def test_per_token_cast_bad_input(kwargs, arg):
    with pytest.raises(pk.ContractError, match=arg):
        pk.per_token_cast_to_fp8(**kwargs)


@pytest.mark.parametrize("kwargs,arg", [
    (dict(x=torch.ones(4, 8, dtype=torch.float64)), "'x'"),
    (dict(x=torch.ones(4, 8), block=(128,)), "'block'"),
    (dict(x=torch.ones(4, 8), block=(0, 128)), "'block\\[0\\]'"),
])
def test_per_block_cast_bad_input(kwargs, arg):
    with pytest.raises(pk.ContractError, match=arg):
        pk.per_block_cast_to_fp8(**kwargs)


def test_prepare_for_unknown_op_or_argument_is_refused():
    with pytest.raises(pk.ContractError, match="unknown op"):
        pk.per_token_cast_to_fp8(torch.ones(2, 128), prepare_for="no_such_op")
    with pytest.raises(pk.ContractError, match="'z'"):
        pk.per_token_cast_to_fp8(torch.ones(2, 128), prepare_for=pk.fp8_gemm_nt, arg="z")


def test_quant_tensor_validates_its_parts():
    with pytest.raises(pk.ContractError, match="scale has shape"):
        pk.QuantTensor(A.data, A.scale[:, :1], (1, 128))
    with pytest.raises(pk.ContractError, match="data"):
        pk.QuantTensor(A.data.float(), A.scale, (1, 128))


def test_errors_are_also_builtin_types():
    assert issubclass(pk.ContractError, ValueError) and issubclass(pk.ContractError, TypeError)
    assert issubclass(pk.LayoutError, ValueError)
    assert issubclass(pk.NoKernelError, RuntimeError) and issubclass(pk.BackendUnavailableError, RuntimeError)
    for cls in (pk.ContractError, pk.LayoutError, pk.NoKernelError, pk.BackendUnavailableError):
        assert issubclass(cls, pk.PortableKernelsError)
