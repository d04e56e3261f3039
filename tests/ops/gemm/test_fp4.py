"""FP4 family: the E2M1 per-token quantizer (known answers, rounding, scales), the FP8×FP4 GEMM
against fp64 references, the fused SwiGLU quantizer, and the bad-input catalogue."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import portable_kernels as pk
from portable_kernels.layouts import unpack_e2m1
from portable_kernels.testing import run_conformance
from portable_kernels.testing.checks import assert_quantization_matches
from portable_kernels.testing.generators import poison, randn

FP4_OPS = ["per_token_cast_to_fp4", "fp8_fp4_gemm_nt", "swiglu_forward_and_per_token_cast"]


def _codes(q: pk.QuantTensor) -> torch.Tensor:
    return unpack_e2m1(q.data)


# -- per_token_cast_to_fp4 --------------------------------------------------------------------------


def test_fp4_cast_worked_example_packs_even_element_low():
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([1.0, -0.5, 6.0, 0.0])  # amax 6 -> scale 1
    q = pk.per_token_cast_to_fp4(x)
    assert q.element == "e2m1" and q.granularity == (1, 32) and q.data.dtype == torch.uint8
    assert q.data.shape == (1, 16) and q.scale.shape == (1, 1)
    assert q.data[0, :2].tolist() == [0x92, 0x07]
    assert q.scale.item() == 1.0


def test_fp4_cast_rounds_ties_to_even_and_keeps_the_sign():
    row = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -6.0, 7.0 / 8.0, 0.1]
    x = torch.tensor(row + [0.0] * (32 - len(row)))[None, :]
    codes = _codes(pk.per_token_cast_to_fp4(x))[0, :len(row)]
    assert codes.tolist() == [0x7, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x8, 0xF, 0x2, 0x0]


def test_fp4_cast_scales_are_powers_of_two_bounding_the_block():
    x = randn(8, 256, seed=1, dtype=torch.bfloat16, scale=5.0)
    q = pk.per_token_cast_to_fp4(x)
    amax = x.float().view(8, 8, 32).abs().amax(-1)
    assert torch.equal(q.scale, 2.0 ** torch.ceil(torch.log2(amax / 6.0)))
    assert (q.scale.view(torch.int32) & 0x7FFFFF == 0).all()


def test_fp4_cast_without_ue8m0_uses_amax_over_six():
    x = randn(4, 64, seed=2)
    q = pk.per_token_cast_to_fp4(x, use_ue8m0=False)
    assert torch.allclose(q.scale, x.view(4, 2, 32).abs().amax(-1) / 6.0, rtol=0, atol=0)
    assert ((_codes(q).view(4, 2, 32) & 0x7).amax(-1) == 0x7).all()  # each block's amax maps to 6


def test_fp4_cast_of_zeros_uses_the_amax_floor():
    q = pk.per_token_cast_to_fp4(torch.zeros(2, 64))
    assert (q.data == 0).all()
    assert torch.equal(q.scale, torch.full((2, 2), 2.0 ** -15))  # ceil_to_ue8m0(1e-4 / 6)


@pytest.mark.parametrize("shape,gran_k", [((3, 300), 32), ((64, 1024), 32), ((2, 5, 64), 32), ((7, 256), 128)])
def test_fp4_cast_dequantizes_close_to_the_input(shape, gran_k):
    x = randn(*shape, seed=sum(shape), dtype=torch.bfloat16)
    q = pk.per_token_cast_to_fp4(x, gran_k=gran_k)
    assert q.scale.shape == (*shape[:-1], -(-shape[-1] // gran_k))
    deq = pk.dequantize(q)
    assert pk.calc_diff(deq, x.float()) <= 2e-2


def test_fp4_cast_prepared_for_the_gemm_converts_nothing():
    x = randn(16, 256, seed=3, dtype=torch.bfloat16)
    w = randn(32, 256, seed=4, dtype=torch.bfloat16)
    a = pk.per_token_cast_to_fp8(x, use_ue8m0=True, prepare_for=pk.fp8_fp4_gemm_nt, arg="a")
    b = pk.per_token_cast_to_fp4(w, prepare_for=pk.fp8_fp4_gemm_nt)
    assert isinstance(b, pk.PreparedTensor) and b.element == "e2m1" and tuple(b.shape) == (32, 256)
    d = poison(16, 32, dtype=torch.float32)
    pk.fp8_fp4_gemm_nt(a, b, d)
    assert pk.implicit_conversions() == 0
    assert torch.isfinite(d).all()


# -- fp8_fp4_gemm_nt ---------------------------------------------------------------------------------


def _gemm_operands(m, n, k, seed, gran_k_a=128):
    x = randn(m, k, seed=seed, dtype=torch.bfloat16)
    w = randn(n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
    return x, w, pk.per_token_cast_to_fp8(x, gran_k=gran_k_a, use_ue8m0=True), pk.per_token_cast_to_fp4(w)


@pytest.mark.parametrize("m,n,k,gran_k_a", [(1, 128, 128, 128), (7, 130, 320, 32), (64, 256, 1024, 128),
                                            (33, 17, 2048, 32)])
def test_fp8_fp4_gemm_matches_dequantized_fp64_reference(m, n, k, gran_k_a):
    x, w, a, b = _gemm_operands(m, n, k, seed=m + n + k, gran_k_a=gran_k_a)
    d = poison(m, n, dtype=torch.float32)
    pk.fp8_fp4_gemm_nt(a, b, d)
    assert pk.calc_diff(d, pk.dequantize(a).double() @ pk.dequantize(b).double().T) <= 1e-6
    assert pk.calc_diff(d, x.double() @ w.double().T) <= 1e-2


def test_fp8_fp4_gemm_adds_c_and_rounds_to_bf16():
    _, _, a, b = _gemm_operands(16, 64, 256, seed=5)
    c = randn(16, 64, seed=6)
    d = poison(16, 64, dtype=torch.bfloat16)
    pk.fp8_fp4_gemm_nt(a, b, d, c=c)
    ref = pk.dequantize(a).double() @ pk.dequantize(b).double().T + c.double()
    assert pk.calc_diff(d, ref) <= 1e-5


def test_fp8_fp4_gemm_accepts_deepgemm_raw_tuples_and_counts_them():
    _, _, a, b = _gemm_operands(8, 32, 256, seed=7)
    d1, d2 = poison(8, 32, dtype=torch.float32), poison(8, 32, dtype=torch.float32)
    pk.fp8_fp4_gemm_nt(a, b, d1)
    pk.reset_implicit_conversions()
    with pytest.warns(pk.ImplicitConversionWarning):
        pk.fp8_fp4_gemm_nt((a.data, a.scale), (b.data.view(torch.int8), b.scale), d2)
    assert pk.implicit_conversions() == 2
    assert torch.equal(d1, d2)


def test_fp8_fp4_gemm_recipes_are_asserted():
    _, _, a, b = _gemm_operands(4, 32, 256, seed=8)
    d = torch.empty(4, 32, dtype=torch.bfloat16)
    pk.fp8_fp4_gemm_nt(a, b, d, recipe_a=(1, 128), recipe_b=(1, 32))
    with pytest.raises(pk.ContractError, match="'recipe_b'"):
        pk.fp8_fp4_gemm_nt(a, b, d, recipe_a=(1, 128), recipe_b=(1, 128))
    with pytest.raises(pk.ContractError, match="'recipe'"):
        pk.fp8_fp4_gemm_nt(a, b, d, recipe=(1, 1, 128))


def test_fp8_fp4_gemm_empty_m_is_a_no_op():
    _, _, a, b = _gemm_operands(0, 32, 64, seed=9)
    d = torch.empty(0, 32, dtype=torch.bfloat16)
    pk.fp8_fp4_gemm_nt(a, b, d)


# -- swiglu_forward_and_per_token_cast ---------------------------------------------------------------


def test_swiglu_gate_is_the_first_half():
    x = randn(8, 256, seed=10, dtype=torch.bfloat16)
    q = pk.swiglu_forward_and_per_token_cast(x, "e4m3", 128)
    gate_first = F.silu(x[:, :128].double()) * x[:, 128:].double()
    gate_last = F.silu(x[:, 128:].double()) * x[:, :128].double()
    deq = pk.dequantize(q)
    assert q.shape == (8, 128) and q.granularity == (1, 128) and q.data.dtype == torch.float8_e4m3fn
    assert pk.calc_diff(deq, gate_first) <= 1e-3
    assert pk.calc_diff(deq, gate_last) > 1e-1


def test_swiglu_cast_equals_swiglu_then_per_token_cast():
    x = randn(33, 512, seed=11, dtype=torch.bfloat16)
    y = (F.silu(x[:, :256].float()) * x[:, 256:].float())
    for round_sf in (False, True):
        q = pk.swiglu_forward_and_per_token_cast(x, "e4m3", 128, round_sf=round_sf)
        want = pk.per_token_cast_to_fp8(y, use_ue8m0=round_sf)
        # a fused kernel's exp may round silu one ulp apart from torch's: the quantizers' own agreement rule
        assert_quantization_matches(q, want, exact_scales=round_sf)


def test_swiglu_weights_rows_and_zeroes_padding_rows():
    x = randn(6, 64, seed=12, dtype=torch.bfloat16)
    topk_weights = torch.tensor([[0.5, 2.0], [1.5, 0.25]])
    pos_to_token_topk = torch.tensor([0, 1, 2, 3, -1, 1], dtype=torch.int32)
    pos_to_expert = torch.tensor([0, 1, 0, -1, -1, 2], dtype=torch.int32)
    q = pk.swiglu_forward_and_per_token_cast(x, "e4m3", 32, pos_to_token_topk, topk_weights, pos_to_expert)
    weight = topk_weights.flatten()[pos_to_token_topk.clamp(min=0).long()]
    ref = F.silu(x[:, :32].double()) * x[:, 32:].double() * weight.double()[:, None]
    deq = pk.dequantize(q)
    valid = torch.tensor([True, True, True, False, False, True])
    assert pk.calc_diff(deq[valid], ref[valid]) <= 1e-3
    assert (q.data[~valid].float() == 0).all()


def test_swiglu_clamps_and_counts_clamped_elements():
    x = torch.tensor([[2.0, -3.0, 0.1, 4.0], [0.5, 0.2, -0.7, 0.9]])
    count = torch.zeros(3, dtype=torch.int64)
    q = pk.swiglu_forward_and_per_token_cast(x, "e4m3", 2, swiglu_clamp_value=1.0, clamped_count=count)
    gate, up = x[:, :2].clamp(max=1.0), x[:, 2:].clamp(-1.0, 1.0)
    assert pk.calc_diff(pk.dequantize(q), F.silu(gate.double()) * up.double()) <= 1e-3
    assert count.tolist() == [1, 1, 0]  # gate 2.0 > 1; up 4.0 > 1; no up below -1


def test_swiglu_prepare_for_a_grouped_gemm_returns_its_bytes():
    q = pk.swiglu_forward_and_per_token_cast(randn(4, 512, seed=13), "e4m3", 128, round_sf=True,
                                             prepare_for=pk.m_grouped_fp8_gemm_nt_contiguous)
    assert isinstance(q, pk.PreparedTensor) and q.tag.backend == "cpu" and tuple(q.shape) == (4, 256)


def test_fp4_ops_pass_quick_conformance_on_cpu():
    report = run_conformance(backend="cpu", ops=FP4_OPS, quick=True)
    assert report.ok, report.format_table()


# -- bad-input catalogue ----------------------------------------------------------------------------

_X = randn(4, 256, seed=20, dtype=torch.bfloat16)
CAST_CASES = {
    "x int": (lambda: ((_X.to(torch.int32),), {}), "'x'"),
    "x 1-D": (lambda: ((_X[0],), {}), "'x'"),
    "x odd K": (lambda: ((_X[:, :255],), {}), "'x'"),
    "x NaN": (lambda: ((torch.full((2, 64), float("nan")),), {}), "'x'"),
    "gran_k zero": (lambda: ((_X,), {"gran_k": 0}), "'gran_k'"),
    "deepgemm order (use_ue8m0 first)": (lambda: ((_X, True), {}), "'gran_k'"),
    "use_ue8m0 int": (lambda: ((_X,), {"use_ue8m0": 1}), "'use_ue8m0'"),
    "prepare_for unknown op": (lambda: ((_X,), {"prepare_for": "no_such_op"}), "no_such_op"),
    "prepare_for wrong arg": (lambda: ((_X,), {"prepare_for": "fp8_fp4_gemm_nt", "arg": "c"}), "'c'"),
}


@pytest.mark.parametrize("name", list(CAST_CASES))
def test_per_token_cast_to_fp4_bad_input(name):
    build, arg = CAST_CASES[name]
    args, kwargs = build()
    with pytest.raises(pk.ContractError, match=arg):
        pk.per_token_cast_to_fp4(*args, **kwargs)


A = pk.per_token_cast_to_fp8(randn(4, 256, seed=21), use_ue8m0=True)
B = pk.per_token_cast_to_fp4(randn(8, 256, seed=22))
D = torch.empty(4, 8, dtype=torch.bfloat16)
GEMM_CASES = {
    "a fp4": (lambda: ((B, B, torch.empty(8, 8, dtype=torch.bfloat16)), {}), "'a'"),
    "a plain tensor": (lambda: ((randn(4, 256, seed=0), B, D), {}), "'a'"),
    "a per-block scales": (lambda: ((pk.per_block_cast_to_fp8(randn(4, 256, seed=0)), B, D), {}), "'a'"),
    "b fp8": (lambda: ((A, pk.per_token_cast_to_fp8(randn(8, 256, seed=0)), D), {}), "'b'"),
    "b raw tuple bad scale": (lambda: ((A, (B.data, torch.ones(8, 3)), D), {}), "'b'"),
    "b raw tuple int32 scale": (lambda: ((A, (B.data, B.scale.view(torch.int32)), D), {}), "'b'"),
    "b wrong K": (lambda: ((A, pk.per_token_cast_to_fp4(randn(8, 128, seed=0)), D), {}), "'b'"),
    "b gran_k 64": (lambda: ((A, pk.per_token_cast_to_fp4(randn(8, 256, seed=0), gran_k=64), D), {}), "'b'"),
    "d wrong shape": (lambda: ((A, B, torch.empty(4, 9, dtype=torch.bfloat16)), {}), "'d'"),
    "d fp16": (lambda: ((A, B, D.half()), {}), "'d'"),
    "d on meta": (lambda: ((A, B, D.to("meta")), {}), "'d'"),
    "c wrong shape": (lambda: ((A, B, D), {"c": torch.zeros(4, 9)}), "'c'"),
    "recipe_a mismatch": (lambda: ((A, B, D), {"recipe_a": (1, 32)}), "'recipe_a'"),
}


@pytest.mark.parametrize("name", list(GEMM_CASES))
def test_fp8_fp4_gemm_nt_bad_input(name):
    build, arg = GEMM_CASES[name]
    args, kwargs = build()
    with pytest.raises(pk.ContractError, match=arg):
        pk.fp8_fp4_gemm_nt(*args, **kwargs)


_S = randn(6, 256, seed=23, dtype=torch.bfloat16)
_P = torch.tensor([0, 1, 2, 3, -1, 1], dtype=torch.int32)
_W = torch.rand(2, 2)
SWIGLU_CASES = {
    "x odd width": (lambda: ((_S[:, :255],), {}), "'x'"),
    "x 3-D": (lambda: ((_S[None],), {}), "'x'"),
    "x int": (lambda: ((_S.to(torch.int16),), {}), "'x'"),
    "fmt e2m1": (lambda: ((_S, "e2m1"), {}), "'fmt'"),
    "num_per_channels zero": (lambda: ((_S, "e4m3", 0), {}), "'num_per_channels'"),
    "packed ue8m0 asked": (lambda: ((_S,), {"use_packed_ue8m0": True, "round_sf": True}), "'use_packed_ue8m0'"),
    "tma col-major asked": (lambda: ((_S,), {"use_tma_aligned_col_major_sf": True}),
                            "'use_tma_aligned_col_major_sf'"),
    "round_sf int": (lambda: ((_S,), {"round_sf": 1}), "'round_sf'"),
    "weights without mapping": (lambda: ((_S,), {"topk_weights": _W}), "'pos_to_token_topk'"),
    "mapping without weights": (lambda: ((_S,), {"pos_to_token_topk": _P}), "'topk_weights'"),
    "mapping int64": (lambda: ((_S,), {"pos_to_token_topk": _P.long(), "topk_weights": _W}), "'pos_to_token_topk'"),
    "mapping out of range": (lambda: ((_S,), {"pos_to_token_topk": _P + 1, "topk_weights": _W}),
                             "'pos_to_token_topk'"),
    "weights fp16": (lambda: ((_S,), {"pos_to_token_topk": _P, "topk_weights": _W.half()}), "'topk_weights'"),
    "weights on meta": (lambda: ((_S,), {"pos_to_token_topk": _P, "topk_weights": _W.to("meta")}),
                        "'topk_weights'"),
    "pos_to_expert short": (lambda: ((_S,), {"pos_to_expert": _P[:5]}), "'pos_to_expert'"),
    "pos_to_expert below -1": (lambda: ((_S,), {"pos_to_expert": _P - 1}), "'pos_to_expert'"),
    "clamp negative": (lambda: ((_S,), {"swiglu_clamp_value": -1.0}), "'swiglu_clamp_value'"),
    "clamp nan": (lambda: ((_S,), {"swiglu_clamp_value": float("nan")}), "'swiglu_clamp_value'"),
    "count without clamp": (lambda: ((_S,), {"clamped_count": torch.zeros(3, dtype=torch.int64)}),
                            "'clamped_count'"),
    "count int32": (lambda: ((_S,), {"swiglu_clamp_value": 1.0, "clamped_count": torch.zeros(3, dtype=torch.int32)}),
                    "'clamped_count'"),
}


@pytest.mark.parametrize("name", list(SWIGLU_CASES))
def test_swiglu_forward_and_per_token_cast_bad_input(name):
    build, arg = SWIGLU_CASES[name]
    args, kwargs = build()
    with pytest.raises(pk.ContractError, match=arg):
        pk.swiglu_forward_and_per_token_cast(*args, **kwargs)
