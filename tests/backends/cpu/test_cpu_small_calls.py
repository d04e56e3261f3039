"""The cpu providers' small-call paths (issue 23): the decode-sized dense fp8 GEMM path gives the
general path's bytes and declines every call it does not cover (which then runs, or is refused
naming the argument, on the general path); top-k keeps only small output templates and still
reads strided inputs right."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import portable_kernels as pk
from portable_kernels.backends.cpu.providers import gemm as ng
from portable_kernels.backends.cpu.providers import topk as nt
from portable_kernels.core.errors import ContractError
from portable_kernels.ops.quant.fp4 import per_token_cast_to_fp4
from portable_kernels.testing.generators import poison, randn
from portable_kernels.testing.topk_cases import check_topk

needs_gemm = pytest.mark.skipif(not ng.available(), reason=f"native GEMM unavailable: {ng.LIB.reason()}")
needs_topk = pytest.mark.skipif(nt.LIB.get() is None, reason=f"native topk unavailable: {nt.LIB.reason()}")


def _operands(m, n, k, seed, ue8m0=False):
    x = randn(m, k, seed=seed)
    w = randn(n, k, seed=seed + 1, scale=k ** -0.5)
    return pk.per_token_cast_to_fp8(x, use_ue8m0=ue8m0), pk.per_block_cast_to_fp8(w, use_ue8m0=ue8m0)


def _args(a, b, d, c, k):
    return a.data, a.scale, 128, b.data, b.scale, (128, 128), d, c, k


@needs_gemm
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 256, 256), (2, 130, 300), (3, 47, 30), (4, 64, 1000)])
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_c", [False, True])
def test_small_fp8_path_gives_the_general_paths_bytes(m, n, k, out, with_c):
    a, b = _operands(m, n, k, seed=m + n + k, ue8m0=with_c)
    c = randn(m, n, seed=5) if with_c else None
    fast, general = poison(m, n, dtype=out), poison(m, n, dtype=out)
    assert ng._small_fp8_dense(*_args(a, b, fast, c, k))
    ng.gemm_dense("t", a.data, a.scale, 128, b.data, b.scale, (128, 128), general, c, k, engine="fma")
    assert bool(torch.isfinite(fast).all()), "some output elements were not written"
    assert torch.equal(fast, general)


def _declined_cases():
    a, b = _operands(4, 32, 256, seed=7)
    d = torch.empty(4, 32, dtype=torch.bfloat16)
    wide = torch.empty(4, 512, dtype=torch.float8_e4m3fn)
    wide[:, :256] = a.data
    five, _ = _operands(5, 32, 256, seed=8)
    fp4 = per_token_cast_to_fp4(randn(32, 256, seed=9), gran_k=32)
    yield "five rows", _args(five, b, torch.empty(5, 32, dtype=torch.bfloat16), None, 256)
    yield "strided a rows", (wide[:, :256], *_args(a, b, d, None, 256)[1:])
    yield "fp4 b", (a.data, a.scale, 128, fp4.data, fp4.scale, (1, 32), d, None, 256)
    yield "bf16 a", (a.data.bfloat16(), *_args(a, b, d, None, 256)[1:])
    yield "transposed sfa", (a.data, a.scale.T.contiguous().T, *_args(a, b, d, None, 256)[2:])
    yield "short sfb", (*_args(a, b, d, None, 256)[:4], b.scale[:, :1], (128, 128), d, None, 256)
    yield "wrong d", (*_args(a, b, d, None, 256)[:6], torch.empty(4, 33, dtype=torch.bfloat16), None, 256)
    yield "c of another shape", (*_args(a, b, d, None, 256)[:7], torch.empty(4, 31), 256)
    yield "K not a's", (*_args(a, b, d, None, 256)[:8], 255)


#: the case names, spelled out: building the cases runs ops, which must not happen at collection (it
#: would import the nvidia kernels before tests/backends/nvidia/conftest.py puts Triton in interpreter mode)
DECLINED = ("five rows", "strided a rows", "fp4 b", "bf16 a", "transposed sfa", "short sfb", "wrong d",
            "c of another shape", "K not a's")


def test_the_declined_case_names_are_the_cases():
    assert tuple(name for name, _ in _declined_cases()) == DECLINED


@needs_gemm
@pytest.mark.parametrize("case", DECLINED)
def test_small_fp8_path_declines_what_it_does_not_cover_and_writes_nothing(case):
    args = dict(_declined_cases())[case]
    d = args[6]
    before = d.clone()
    assert not ng._small_fp8_dense(*args)
    assert torch.equal(d.view(torch.uint8) if d.dtype != torch.bfloat16 else d.view(torch.int16),
                       before.view(torch.uint8) if d.dtype != torch.bfloat16 else before.view(torch.int16))


@needs_gemm
def test_fp8_provider_refuses_bad_scales_naming_them_after_the_small_path_declines():
    a, b = _operands(1, 64, 256, seed=11)
    good = SimpleNamespace(storage_granularity=(1, 128), shape=(1, 256), ue8m0=False)
    d = torch.empty(1, 64, dtype=torch.bfloat16)
    call = SimpleNamespace(a=SimpleNamespace(data=a.data, scale=a.scale[:, :1], **vars(good)),
                           b=SimpleNamespace(data=b.data, scale=b.scale, storage_granularity=(128, 128),
                                             shape=(64, 256), ue8m0=False), d=d, c=None)
    with pytest.raises(ContractError, match="sfa"):
        ng.fp8_gemm_nt_native(call)


@needs_gemm
def test_fp8_provider_runs_strided_rows_on_the_general_path():
    a, b = _operands(2, 64, 256, seed=12)
    wide = torch.empty(2, 384, dtype=torch.float8_e4m3fn)
    wide[:, :256] = a.data
    ref, out = poison(2, 64, dtype=torch.float32), poison(2, 64, dtype=torch.float32)
    ng.gemm_dense("t", a.data, a.scale, 128, b.data, b.scale, (128, 128), ref, None, 256, engine="fma")
    call = SimpleNamespace(a=SimpleNamespace(data=wide[:, :256], scale=a.scale, storage_granularity=(1, 128),
                                             shape=(2, 256), ue8m0=False),
                           b=SimpleNamespace(data=b.data, scale=b.scale, storage_granularity=(128, 128),
                                             shape=(64, 256), ue8m0=False), d=out, c=None)
    ng.fp8_gemm_nt_native(call)
    assert torch.equal(out, ref)


@needs_topk
def test_topk_templates_of_large_outputs_hold_no_memory_and_outputs_are_fresh():
    nt._TEMPLATES.clear()
    small = nt.topk_native(randn(2, 100, seed=13), 8)
    rows = nt._MAX_CONTIGUOUS_TEMPLATE // 64 + 1
    large = nt.topk_native(randn(rows, 80, seed=14), 64)
    for (b, k), (values, indices) in (((2, 8), small), ((rows, 64), large)):
        templates = nt._TEMPLATES[(b, k, torch.int64, torch.float32)]
        for template, out in zip(templates, (indices, values)):
            assert out.is_contiguous() and out.shape == (b, k)
            assert out.untyped_storage().data_ptr() != template.untyped_storage().data_ptr()
    for template in nt._TEMPLATES[(rows, 64, torch.int64, torch.float32)]:
        assert template.untyped_storage().nbytes() == template.element_size()


@needs_topk
@pytest.mark.parametrize("layout", ["row slice", "column view", "single strided row"])
def test_topk_reads_strided_inputs_right(layout):
    base = randn(6, 300, seed=15)
    x = {"row slice": base[:, 10:210], "column view": base.T.contiguous().T[:, :200],
         "single strided row": base[2:3, ::2]}[layout]
    values, indices = nt.topk_native(x, 9, sorted=True)
    check_topk(x, 9, None, values, indices, sorted=True)
    assert torch.equal(values, torch.topk(x, 9).values)
