"""The small-call paths of issue 23: the written-out signatures of TopkInputs and GemmInputs are the
generic `Inputs.signature` tuple for every field combination, and the one-expression argument
checks of `topk` / `fp8_gemm_nt` accept exactly what the checks one by one accept (a call they do
not recognise takes those checks and still runs; a bad one raises the error naming the argument)."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.core.errors import ContractError
from portable_kernels.core.providers import Inputs
from portable_kernels.ops.gemm.dense import GemmInputs
from portable_kernels.ops.quant.fp8 import dequantize_reference
from portable_kernels.ops.topk import TopkInputs
from portable_kernels.testing.topk_cases import check_topk
from portable_kernels.testing.generators import poison, randn


def _topk_inputs():
    x = randn(3, 40, seed=1)
    end = torch.tensor([40, 7, 0], dtype=torch.int32)
    yield TopkInputs(x, 5, None, False, False, torch.int64, 2**31 - 1, float("-inf"), True)
    yield TopkInputs(x.bfloat16(), 5, end, True, False, torch.int32, -1, 0.5, False)
    yield TopkInputs(x, 5, end, False, True, torch.int64, 7, -1.0, True)
    # hand-built values of other types take the generic walk (ints are not bools there)
    yield TopkInputs(x, 5, None, 1, 0, torch.int64, 7, -1.0, 1)
    yield TopkInputs(torch.nn.Parameter(x, requires_grad=False), 5, None, False, False, torch.int64, 7, -1.0, True)


@pytest.mark.parametrize("index", range(5))
def test_topk_inputs_signature_is_the_generic_one(index):
    inputs = list(_topk_inputs())[index]
    assert inputs.signature() == Inputs.signature(inputs)


def _gemm_inputs():
    x, w = randn(2, 256, seed=2), randn(64, 256, seed=3, scale=256 ** -0.5)
    a, b = pk.per_token_cast_to_fp8(x), pk.per_block_cast_to_fp8(w)
    prepared = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
    pa, pb = prepared["a"], prepared["b"]
    d = torch.empty(2, 64, dtype=torch.bfloat16)
    yield GemmInputs(pa, pb, d, None)
    yield GemmInputs(pa, pb, d.float(), randn(2, 64, seed=4))
    yield GemmInputs(a, b, d, None)  # QuantTensors: the generic walk
    yield GemmInputs(x.bfloat16(), w.bfloat16(), d, None)
    yield GemmInputs(pa, pb, d, (1, 2))  # not a tensor: the generic walk


@pytest.mark.parametrize("index", range(5))
def test_gemm_inputs_signature_is_the_generic_one(index):
    inputs = list(_gemm_inputs())[index]
    assert inputs.signature() == Inputs.signature(inputs)


class _Int(int):
    """An int subclass: not the common call's exact type, still an int the contract accepts."""


def test_topk_arguments_of_other_types_take_the_checks_one_by_one_and_run():
    x = randn(4, 300, seed=5)
    plain_values, plain_indices = pk.topk(x, 9, sorted=True)
    param = torch.nn.Parameter(x.clone(), requires_grad=False)
    values, indices = pk.topk(param, _Int(9), sorted=True,
                              value_oob_fill_value=_Int(-5))
    assert torch.equal(values, plain_values) and torch.equal(indices, plain_indices)
    check_topk(x, 9, None, values, indices, sorted=True)


@pytest.mark.parametrize("change,arg", [
    (dict(topk=True), "topk"), (dict(topk=4097), "topk"), (dict(sorted=1), "sorted"),
    (dict(return_value=None), "return_value"), (dict(abort_when_nan_found=0), "abort_when_nan_found"),
    (dict(sorted=True, sorted_index=True), "sorted_index"), (dict(hint=1), "hint"), (dict(begin=1), "begin"),
    (dict(indices_type=torch.int16), "indices_type"), (dict(idx_oob_fill_value=2**40, indices_type=torch.int32),
                                                        "idx_oob_fill_value"),
    (dict(idx_oob_fill_value=1.0), "idx_oob_fill_value"), (dict(value_oob_fill_value="x"), "value_oob_fill_value"),
])
def test_topk_bad_scalars_still_raise_naming_the_argument(change, arg):
    kwargs = dict(topk=4, **{k: v for k, v in change.items() if k != "topk"})
    if "topk" in change:
        kwargs["topk"] = change["topk"]
    with pytest.raises(ContractError, match=arg):
        pk.topk(randn(2, 16, seed=6), **kwargs)


def test_topk_input_of_another_dtype_or_rank_still_raises_naming_input():
    for bad in (randn(2, 16, seed=7).double(), randn(16, seed=7), [1.0, 2.0]):
        with pytest.raises(ContractError, match="input"):
            pk.topk(bad, 2)


def _fp8(m, n, k, seed):
    x, w = randn(m, k, seed=seed), randn(n, k, seed=seed + 1, scale=k ** -0.5)
    a, b = pk.per_token_cast_to_fp8(x), pk.per_block_cast_to_fp8(w)
    prepared = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
    return a, b, prepared["a"], prepared["b"]


@pytest.mark.parametrize("with_c", [False, True])
def test_fp8_gemm_nt_with_c_or_raw_tuples_takes_the_full_checks_and_matches_the_reference(with_c):
    a, b, pa, pb = _fp8(3, 40, 200, seed=8)
    c = randn(3, 40, seed=9) if with_c else None
    ref = dequantize_reference(a).double() @ dequantize_reference(b).double().T
    if with_c:
        ref = ref + c.double()
    for lhs, rhs in ((pa, pb), ((a.data, a.scale), (b.data, b.scale))):
        d = poison(3, 40, dtype=torch.float32)
        pk.fp8_gemm_nt(lhs, rhs, d, c)
        assert torch.allclose(d.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d,arg", [
    (torch.empty(2, 64, dtype=torch.bfloat16, device="meta"), "d"),     # on another device than a and b
    (torch.empty(64, 2, dtype=torch.bfloat16).T, "d"),                  # not row-major
    (torch.empty(2, 65, dtype=torch.bfloat16), "d"),                    # another shape
    (torch.empty(2, 64, dtype=torch.float16), "d"),                     # another dtype
])
def test_fp8_gemm_nt_bad_outputs_still_raise_naming_d(d, arg):
    _, _, pa, pb = _fp8(2, 64, 128, seed=10)
    with pytest.raises(ContractError, match=f"'{arg}'|{arg}:| {arg} "):
        pk.fp8_gemm_nt(pa, pb, d)


def test_fp8_gemm_nt_bad_recipe_or_k_still_raise_naming_the_argument():
    _, _, pa, pb = _fp8(2, 64, 128, seed=11)
    _, _, _, pb_other_k = _fp8(2, 64, 256, seed=12)
    d = torch.empty(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ContractError, match="recipe"):
        pk.fp8_gemm_nt(pa, pb, d, recipe=(1, 128, 64))
    with pytest.raises(ContractError, match="b"):
        pk.fp8_gemm_nt(pa, pb_other_k, d)
