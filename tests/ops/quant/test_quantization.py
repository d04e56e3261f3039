"""FP8 quantizers: known answers, round trips, clamping, UE8M0 scales, dequantize forms."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.layouts import is_power_of_two
from portable_kernels.testing.generators import randn


def test_per_token_known_answer_scale_is_amax_over_448():
    x = torch.tensor([[1.0, -2.0, 0.5, 0.25], [448.0, 0.0, -896.0, 1.0]])
    q = pk.per_token_cast_to_fp8(x, gran_k=2)
    torch.testing.assert_close(q.scale, torch.tensor([[2 / 448, 0.5 / 448], [448 / 448, 896 / 448]]))
    assert q.data.float().tolist() == [[224.0, -448.0, 448.0, 224.0], [448.0, 0.0, -448.0, 0.5]]


def test_per_token_round_trip_error_is_fp8_sized():
    x = randn(64, 1000, seed=1, dtype=torch.bfloat16, scale=5.0)
    q = pk.per_token_cast_to_fp8(x)
    assert q.scale.shape == (64, 8) and q.granularity == (1, 128)
    assert pk.calc_diff(pk.dequantize(q), x.float()) < 1e-3


def test_per_block_scales_cover_128x128_blocks_with_partial_edges():
    w = randn(130, 300, seed=2, scale=0.1)
    q = pk.per_block_cast_to_fp8(w)
    assert q.scale.shape == (2, 3)
    expected = w[128:, 256:].abs().max() / 448
    torch.testing.assert_close(q.scale[1, 2], expected)
    assert pk.calc_diff(pk.dequantize(q), w) < 1e-3


def test_grouped_weights_quantize_per_group():
    w = randn(3, 256, 128, seed=3)
    q = pk.per_block_cast_to_fp8(w)
    assert q.scale.shape == (3, 2, 1)
    assert pk.calc_diff(pk.dequantize(q), w) < 1e-3


def test_ue8m0_scales_are_powers_of_two_and_values_stay_in_range():
    x = randn(16, 512, seed=4, scale=100.0)
    q = pk.per_token_cast_to_fp8(x, use_ue8m0=True)
    assert q.ue8m0 and is_power_of_two(q.scale)
    assert q.data.float().abs().max() <= 448
    assert pk.calc_diff(pk.dequantize(q), x) < 2e-3


def test_quantizer_never_produces_nan_on_extreme_finite_values():
    x = torch.tensor([[3.0e38, -3.0e38, 1e-30, 0.0]])
    q = pk.per_token_cast_to_fp8(x)
    assert torch.isfinite(q.data.float()).all()
    assert q.data.float().abs().max() == 448


def test_all_zero_block_uses_amax_floor():
    q = pk.per_token_cast_to_fp8(torch.zeros(2, 128))
    torch.testing.assert_close(q.scale, torch.full((2, 1), 1e-4 / 448))
    assert (q.data.float() == 0).all()


def test_quant_tensor_unpacks_as_deepgemm_tuple():
    q = pk.per_token_cast_to_fp8(randn(4, 128, seed=5))
    data, scale = q
    assert data is q.data and scale is q.scale


def test_dequantize_accepts_raw_tuple_and_prepared():
    q = pk.per_token_cast_to_fp8(randn(4, 256, seed=6))
    expect = pk.dequantize(q)
    assert torch.equal(pk.dequantize((q.data, q.scale)), expect)
    prepared = pk.prepare_inputs("fp8_gemm_nt", a=q)["a"]
    assert torch.equal(pk.dequantize(prepared), expect)


def test_prepare_for_returns_activation_in_the_consumer_layout_without_implicit_conversion():
    a = pk.per_token_cast_to_fp8(randn(8, 256, seed=7), prepare_for=pk.fp8_gemm_nt)
    assert isinstance(a, pk.PreparedTensor) and a.tag.backend == "cpu"
    b = pk.prepare_inputs(pk.fp8_gemm_nt, b=pk.per_block_cast_to_fp8(randn(16, 256, seed=8)))["b"]
    pk.fp8_gemm_nt(a, b, torch.empty(8, 16, dtype=torch.bfloat16))
    assert pk.implicit_conversions() == 0


def test_quantized_outputs_are_bitwise_deterministic():
    x = randn(32, 384, seed=9, dtype=torch.bfloat16)
    first, second = pk.per_token_cast_to_fp8(x), pk.per_token_cast_to_fp8(x)
    assert torch.equal(first.data.view(torch.uint8), second.data.view(torch.uint8))
    assert torch.equal(first.scale, second.scale)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_all_float_input_dtypes_quantize(dtype):
    q = pk.per_token_cast_to_fp8(randn(3, 200, seed=10, dtype=dtype))
    assert q.data.dtype == torch.float8_e4m3fn and q.scale.dtype == torch.float32
