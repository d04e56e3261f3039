"""FP4 E2M1: codes, rounding, nibble packing, scale rule."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layouts_gen import generator, seeds
from portable_kernels.layouts import (
    LayoutConversionError,
    e2m1_decode,
    e2m1_encode,
    fp4_scale_from_amax,
    pack_e2m1,
    unpack_e2m1,
)

FAST = settings(max_examples=40, deadline=None, derandomize=True)
MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _nearest_even_code(x: torch.Tensor) -> torch.Tensor:
    """Brute-force reference: nearest magnitude in fp64, ties to the even index, sign in bit 3."""
    mag = x.double().abs().clamp(max=6.0)
    dist = (mag.unsqueeze(-1) - torch.tensor(MAGNITUDES, dtype=torch.float64)).abs()
    best = dist == dist.min(dim=-1, keepdim=True).values
    even = best & (torch.arange(8) % 2 == 0)
    index = torch.where(even.any(-1), even.double().argmax(-1), best.double().argmax(-1))
    return (index | (torch.signbit(x).long() << 3)).to(torch.uint8)


def test_e2m1_codes_of_every_representable_value():
    values = torch.tensor(MAGNITUDES + [-v for v in MAGNITUDES])
    assert e2m1_encode(values).tolist() == list(range(8)) + list(range(8, 16))


def test_e2m1_decode_table():
    codes = torch.arange(16, dtype=torch.uint8)
    assert e2m1_decode(codes).tolist() == MAGNITUDES + [-v for v in MAGNITUDES]
    assert torch.signbit(e2m1_decode(torch.tensor([8], dtype=torch.uint8)))[0]


def test_e2m1_ties_go_to_even_code():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -5.0])
    assert e2m1_encode(ties).tolist() == [0, 2, 2, 4, 4, 6, 6, 0xA, 0xE]


def test_e2m1_saturates_above_six_and_keeps_sign_of_small_negatives():
    x = torch.tensor([6.5, 100.0, -7.0, -0.1, -0.0])
    assert e2m1_encode(x).tolist() == [7, 7, 0xF, 8, 8]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_e2m1_accepts_float_dtypes(dtype):
    assert e2m1_encode(torch.tensor([1.5, -3.0], dtype=dtype)).tolist() == [3, 0xD]


def test_e2m1_refuses_nan_and_inf():
    with pytest.raises(LayoutConversionError, match="NaN or inf"):
        e2m1_encode(torch.tensor([1.0, float("nan")]))


@FAST
@given(values=st.lists(st.floats(-8.0, 8.0, width=32), min_size=1, max_size=64))
def test_e2m1_encode_matches_brute_force_nearest_even(values):
    x = torch.tensor(values, dtype=torch.float32)
    assert torch.equal(e2m1_encode(x), _nearest_even_code(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_e2m1_encode_matches_brute_force_on_dense_grid(dtype):
    x = torch.linspace(-7.0, 7.0, 56001, dtype=torch.float64).to(dtype)  # step 0.00025 hits every tie
    assert torch.equal(e2m1_encode(x), _nearest_even_code(x))


def test_e2m1_encode_neighbours_of_every_tie():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    for direction in (0.0, 10.0):  # a handful of dims, not elements
        x = torch.nextafter(ties, torch.full_like(ties, direction))
        assert torch.equal(e2m1_encode(x), _nearest_even_code(x))
    x64 = torch.nextafter(ties.double(), torch.zeros(7, dtype=torch.float64))
    assert torch.equal(e2m1_encode(x64), _nearest_even_code(x64))


def test_e2m1_encode_does_not_modify_its_input():
    x = torch.tensor([0.3, -2.6, 7.0])
    e2m1_encode(x)
    assert x.tolist() == [pytest.approx(0.3), pytest.approx(-2.6), 7.0]


def test_pack_puts_even_element_in_low_nibble():
    # values [1.0, -0.5, 6.0, 0.0] -> codes [0x2, 0x9, 0x7, 0x0] -> bytes [0x92, 0x07]
    codes = torch.tensor([0x2, 0x9, 0x7, 0x0], dtype=torch.uint8)
    assert pack_e2m1(codes).tolist() == [0x92, 0x07]
    assert pack_e2m1(e2m1_encode(torch.tensor([1.0, -0.5, 6.0, 0.0]))).tolist() == [0x92, 0x07]


def test_pack_two_dim_rows_are_independent():
    codes = torch.tensor([[0xF, 0x1, 0x0, 0x8], [0x3, 0xC, 0x5, 0x6]], dtype=torch.uint8)
    assert pack_e2m1(codes).tolist() == [[0x1F, 0x80], [0xC3, 0x65]]


def test_pack_refuses_odd_k():
    with pytest.raises(LayoutConversionError, match="even"):
        pack_e2m1(torch.zeros(3, 5, dtype=torch.uint8))


def test_pack_refuses_values_above_four_bits():
    with pytest.raises(LayoutConversionError, match="0..15"):
        pack_e2m1(torch.tensor([0x10, 0x0], dtype=torch.uint8))


def test_unpack_accepts_int8_storage():
    packed = torch.tensor([0x92, 0x07], dtype=torch.uint8).view(torch.int8)
    assert unpack_e2m1(packed).tolist() == [0x2, 0x9, 0x7, 0x0]


@FAST
@given(lead=st.lists(st.integers(1, 3), max_size=2), half_k=st.integers(1, 40), seed=seeds)
def test_pack_unpack_round_trip(lead, half_k, seed):
    codes = torch.randint(0, 16, (*lead, 2 * half_k), generator=generator(seed), dtype=torch.uint8)
    packed = pack_e2m1(codes)
    assert packed.shape == (*lead, half_k) and packed.dtype == torch.uint8
    assert torch.equal(packed, (codes[..., 0::2] | codes[..., 1::2] << 4))
    assert torch.equal(unpack_e2m1(packed), codes)


def test_pack_handles_non_contiguous_codes():
    codes = torch.randint(0, 16, (6, 8), generator=generator(), dtype=torch.uint8).t()
    assert torch.equal(unpack_e2m1(pack_e2m1(codes)), codes)


def test_fp4_scale_is_amax_over_six_rounded_up_to_power_of_two():
    amax = torch.tensor([6.0, 7.0, 3.0, 0.0])
    assert fp4_scale_from_amax(amax).tolist() == [1.0, 2.0, 0.5, 2.0**-126]


def test_fp4_quantized_block_stays_within_six():
    x = torch.randn(64, 32, generator=generator()) * 10
    sf = fp4_scale_from_amax(x.abs().amax(-1))
    codes = e2m1_encode(x / sf.unsqueeze(-1))
    err = (e2m1_decode(codes) * sf.unsqueeze(-1) - x).abs()
    # one E2M1 step is at most 2 (between 4 and 6); half a step times the scale bounds the error
    assert bool((err <= sf.unsqueeze(-1)).all())
