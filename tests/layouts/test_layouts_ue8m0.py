"""UE8M0 exponent helpers: power-of-two test, ceil rule, exponent bytes, decode."""

import math

import pytest
import torch

from portable_kernels.layouts import (
    LayoutConversionError,
    ceil_to_ue8m0,
    is_power_of_two,
    ue8m0_exponents,
    ue8m0_to_fp32,
)


def test_is_power_of_two_accepts_normal_powers_of_two():
    assert is_power_of_two(torch.tensor([1.0, 0.5, 2.0, 2.0**-126, 2.0**127]))


@pytest.mark.parametrize("value", [1.5, 3.0, -2.0, 0.0, -0.0, 2.0**-127, math.inf, math.nan, 1e-45])
def test_is_power_of_two_rejects_non_powers_zero_subnormal_negative_and_non_finite(value):
    assert not is_power_of_two(torch.tensor([1.0, value]))


def test_is_power_of_two_is_true_for_empty():
    assert is_power_of_two(torch.empty(0))


def test_is_power_of_two_requires_fp32():
    with pytest.raises(LayoutConversionError, match="fp32"):
        is_power_of_two(torch.tensor([1.0], dtype=torch.bfloat16))


def test_ceil_to_ue8m0_rounds_up_to_next_power_of_two():
    x = torch.tensor([1.0, 1.5, 0.3, 2.0, 3.0, 1e-4 / 448, 500 / 448])
    expected = torch.tensor([1.0, 2.0, 0.5, 2.0, 4.0, 2.0**-22, 2.0])
    assert torch.equal(ceil_to_ue8m0(x), expected)


def test_ceil_to_ue8m0_clamps_zero_and_subnormals_to_two_pow_minus_126():
    x = torch.tensor([0.0, -0.0, 1e-45, 2.0**-127])
    assert torch.equal(ceil_to_ue8m0(x), torch.full((4,), 2.0**-126))


def test_ceil_to_ue8m0_clamps_largest_finite_to_two_pow_127():
    x = torch.tensor([3.0e38, 2.0**127])
    assert torch.equal(ceil_to_ue8m0(x), torch.full((2,), 2.0**127))


def test_ceil_to_ue8m0_returns_bits_with_zero_mantissa():
    x = torch.rand(1000, generator=torch.Generator().manual_seed(1)) * 100 + 1e-6
    y = ceil_to_ue8m0(x)
    assert is_power_of_two(y)
    assert bool((y >= x).all()) and bool((y < 2 * x).all())


@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan])
def test_ceil_to_ue8m0_refuses_negative_and_non_finite(value):
    with pytest.raises(LayoutConversionError):
        ceil_to_ue8m0(torch.tensor([value]))


def test_ue8m0_exponents_are_fp32_exponent_bytes():
    x = torch.tensor([1.0, 2.0, 0.5, 2.0**-126, 2.0**127])
    e = ue8m0_exponents(x)
    assert e.dtype == torch.uint8
    assert e.tolist() == [0x7F, 0x80, 0x7E, 0x01, 0xFE]


def test_ue8m0_exponents_refuses_non_powers_of_two_and_names_the_fix():
    with pytest.raises(LayoutConversionError, match="ceil_to_ue8m0"):
        ue8m0_exponents(torch.tensor([1.0, 1.5]))


def test_ue8m0_to_fp32_matches_torch_float8_e8m0fnu_for_all_256_bytes():
    e = torch.arange(256, dtype=torch.uint8)
    ours = ue8m0_to_fp32(e)
    theirs = e.view(torch.float8_e8m0fnu).float()
    assert torch.equal(ours[:255], theirs[:255])
    assert math.isnan(ours[255]) and math.isnan(theirs[255])


def test_ue8m0_to_fp32_known_values():
    e = torch.tensor([0, 1, 126, 127, 128, 254], dtype=torch.uint8)
    assert ue8m0_to_fp32(e).tolist() == [2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127]


def test_ue8m0_round_trip_is_bit_exact():
    x = ((torch.arange(1, 255, dtype=torch.int32)) << 23).view(torch.float32)
    assert torch.equal(ue8m0_to_fp32(ue8m0_exponents(x)), x)
