"""The cpu backend's native GEMMs (backends/cpu/native/gemm.*): both engines against the
dequantized reference on odd shapes, exact element conversions, untouched padding rows, argument
checks before any C++ runs, and the providers the registry picks."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.backends.cpu.native import gemm as ng
from portable_kernels.dispatch import trace_providers
from portable_kernels.errors import ContractError
from portable_kernels.fp4 import per_token_cast_to_fp4
from portable_kernels.numerics import calc_diff
from portable_kernels.quantization import dequantize_reference, per_block_cast_to_fp8, per_token_cast_to_fp8
from portable_kernels.testing.generators import poison, randn

pytestmark = pytest.mark.skipif(not ng.available(), reason=f"native GEMM unavailable: {ng.LIB.reason()}")

ENGINES = ["fma", pytest.param("amx", marks=pytest.mark.skipif(not ng.amx_available(), reason="no AMX-BF16 here"))]
SHAPES = [(1, 1, 1), (1, 128, 128), (3, 130, 300), (17, 1, 64), (40, 100, 1000), (33, 47, 30), (0, 5, 64), (4, 0, 64)]
#: fp32 output against the fp64 reference of the dequantized operands: only summation order differs
FP32_BOUND = 1e-9


def _fp8_operands(m, n, k, seed, ue8m0):
    x = randn(m, k, seed=seed, dtype=torch.bfloat16)
    w = randn(n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
    return per_token_cast_to_fp8(x, use_ue8m0=ue8m0), per_block_cast_to_fp8(w, use_ue8m0=ue8m0)


def _reference(a, b, c=None):
    out = a.double() @ b.double().T
    return out if c is None else out + c.double()


def _close(d, ref):
    if d.numel() == 0:
        return
    assert bool(torch.isfinite(d).all()), "some output elements were not written"
    assert calc_diff(d, ref) <= FP32_BOUND


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_gemm_matches_the_dequantized_reference(engine, m, n, k, ue8m0):
    a, b = _fp8_operands(m, n, k, seed=10 * m + n + k, ue8m0=ue8m0)
    c = randn(m, n, seed=3)
    d = poison(m, n, dtype=torch.float32)
    ran = ng.gemm_segments("t", a.data, a.scale, 128, b.data[None], b.scale[None], (128, 128), d, c,
                           ng.dense_segments(m), k, engine=engine)
    assert ran == engine
    _close(d, _reference(dequantize_reference(a), dequantize_reference(b), c))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (5, 33, 1000), (40, 100, 96)])
def test_bf16_gemm_accumulates_in_fp32_with_c(engine, m, n, k):
    a = randn(m, k, seed=1, dtype=torch.bfloat16)
    b = randn(n, k, seed=2, dtype=torch.bfloat16)
    c = randn(m, n, seed=3, dtype=torch.bfloat16)
    d = poison(m, n, dtype=torch.float32)
    ng.gemm_segments("t", a, None, 128, b[None], None, (1, 1), d, c, ng.dense_segments(m), k, engine=engine)
    _close(d, _reference(a, b, c))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (3, 130, 300), (40, 100, 1000)])
def test_fp8_fp4_gemm_matches_the_dequantized_reference(engine, pow2, m, n, k):
    x = randn(m, k, seed=4, dtype=torch.bfloat16)
    w = randn(n, k, seed=5, dtype=torch.bfloat16)
    a = per_token_cast_to_fp8(x)
    b = per_token_cast_to_fp4(w, gran_k=32, use_ue8m0=pow2)
    d = poison(m, n, dtype=torch.float32)
    ng.gemm_segments("t", a.data, a.scale, 128, b.data[None], b.scale[None], (1, 32), d, None, ng.dense_segments(m),
                     k, engine=engine, b_pow2=pow2)
    _close(d, _reference(dequantize_reference(a), dequantize_reference(b)))


@pytest.mark.parametrize("engine", ENGINES)
def test_every_fp8_code_converts_exactly_on_both_sides(engine):
    codes = torch.arange(256, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # the two NaN codes
    values = codes.view(torch.float8_e4m3fn)
    eye = torch.eye(256).to(torch.float8_e4m3fn)
    ones_a, ones_b = torch.ones(1, 2), torch.ones(1, 2, 2)
    d = poison(1, 256, dtype=torch.float32)
    ng.gemm_segments("t", values[None], ones_a, 128, eye[None], ones_b, (128, 128), d, None, ng.dense_segments(1), 256,
                     engine=engine)
    assert torch.equal(d[0], values.float())
    one = torch.zeros(1, 256, dtype=torch.uint8)
    one[0, 0] = 0x38  # 1.0
    b = torch.zeros(256, 256, dtype=torch.uint8)
    b[:, 0] = codes
    d = poison(1, 256, dtype=torch.float32)
    ng.gemm_segments("t", one.view(torch.float8_e4m3fn), ones_a, 128, b.view(torch.float8_e4m3fn)[None], ones_b,
                     (128, 128), d, None, ng.dense_segments(1), 256, engine=engine)
    assert torch.equal(d[0], values.float())


@pytest.mark.parametrize("engine", ENGINES)
def test_segments_write_only_their_rows_with_their_group(engine):
    g, n, k = 3, 40, 256
    a, _ = _fp8_operands(20, 1, k, seed=7, ue8m0=False)
    w = randn(g, n, k, seed=8, dtype=torch.bfloat16)
    b = per_block_cast_to_fp8(w)
    segs = torch.tensor([[0, 5, 2], [7, 6, 0], [13, 1, 2]], dtype=torch.int64)  # rows 5, 6, 14..19 are padding
    d = poison(20, n, dtype=torch.bfloat16)
    ng.gemm_segments("t", a.data, a.scale, 128, b.data, b.scale, (128, 128), d, None, segs, k, engine=engine)
    da, db = dequantize_reference(a), dequantize_reference(b)
    for first, rows, group in segs.tolist():
        ref = _reference(da[first:first + rows], db[group])
        assert calc_diff(d[first:first + rows], ref) < 1e-5
    untouched = torch.ones(20, dtype=torch.bool)
    for first, rows, _ in segs.tolist():
        untouched[first:first + rows] = False
    assert bool(torch.isnan(d[untouched].float()).all())


def test_strided_activation_rows_are_read_in_place():
    a, b = _fp8_operands(6, 32, 256, seed=9, ue8m0=False)
    wide = torch.zeros(6, 300, dtype=torch.uint8)
    wide[:, :256] = a.data.view(torch.uint8)
    strided = wide.view(torch.float8_e4m3fn)[:, :256]
    d = poison(6, 32, dtype=torch.float32)
    ng.gemm_segments("t", strided, a.scale, 128, b.data[None], b.scale[None], (128, 128), d, None, ng.dense_segments(6),
                     256)
    _close(d, _reference(dequantize_reference(a), dequantize_reference(b)))


@pytest.mark.parametrize("change,arg", [
    (lambda kw: kw.update(b=kw["b"].transpose(1, 2).contiguous().transpose(1, 2)), "b"),
    (lambda kw: kw.update(sfa=kw["sfa"][:2]), "sfa"),
    (lambda kw: kw.update(d=torch.empty(4, 9)), "d"),
    (lambda kw: kw.update(segments=torch.tensor([[2, 3, 0]])), "segments"),
    (lambda kw: kw.update(segments=torch.tensor([[0, 1, 1]])), "segments"),
    (lambda kw: kw.update(a=kw["a"].float()), "a"),
])
def test_bad_arguments_are_refused_before_native_code_runs(change, arg):
    a, b = _fp8_operands(4, 8, 128, seed=11, ue8m0=False)
    kw = dict(a=a.data, sfa=a.scale, b=b.data[None], sfb=b.scale[None], d=torch.empty(4, 8),
              segments=ng.dense_segments(4))
    change(kw)
    with pytest.raises(ContractError, match=f"'{arg}'"):
        ng.gemm_segments("t", kw["a"], kw["sfa"], 128, kw["b"], kw["sfb"], (128, 128), kw["d"], None, kw["segments"],
                         128)


def test_segments_of_a_row_group_map_are_its_runs():
    groups = torch.tensor([1, 1, -1, 0, 0, 0, 1, -1, -1], dtype=torch.int32)
    assert ng.contiguous_segments(groups).tolist() == [[0, 2, 1], [3, 3, 0], [6, 1, 1]]
    assert ng.masked_segments(torch.tensor([2, 0, 5], dtype=torch.int32), 4).tolist() == [[0, 2, 0], [8, 4, 2]]


@pytest.mark.parametrize("m", [1, 64])
def test_public_gemm_ops_run_the_native_provider(m):
    a, b = _fp8_operands(m, 96, 512, seed=12, ue8m0=False)
    prepared = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
    d = poison(m, 96, dtype=torch.bfloat16)
    with trace_providers() as ran:
        pk.fp8_gemm_nt(prepared["a"], prepared["b"], d)
        x, w = randn(m, 512, seed=1, dtype=torch.bfloat16), randn(96, 512, seed=2, dtype=torch.bfloat16)
        pk.bf16_gemm_nt(x, w, torch.empty(m, 96, dtype=torch.bfloat16))
        pk.bf16_gemm_nt(x, w, torch.empty(m, 96), c=torch.zeros(m, 96))
    assert ran == [("fp8_gemm_nt", "cpu", "native"), ("bf16_gemm_nt", "cpu", "torch-blas"),
                   ("bf16_gemm_nt", "cpu", "native")]
    assert calc_diff(d, _reference(dequantize_reference(a), dequantize_reference(b))) < 1e-5
