"""E5M6 codes and packing (layouts.e5m6): known answers, TileKernels' rounding rule and its edges,
an exhaustive decode -> encode round trip, bad input."""

import pytest
import torch

from portable_kernels.layouts.e5m6 import E5M6_MAX, e5m6_decode, e5m6_encode, pack_e5m6, unpack_e5m6
from portable_kernels.layouts.errors import LayoutConversionError


def _codes(*values: float) -> list[int]:
    return e5m6_encode(torch.tensor(values, dtype=torch.float32)).tolist()


def test_docstring_example_packs_three_little_endian_words():
    x = torch.tensor([[1.0, -2.0, E5M6_MAX, 2.0 ** -20, 0.0, -0.0, 0.5, 3.0]])
    codes = e5m6_encode(x)
    assert codes.tolist() == [[0x3C0, 0xC00, 0x7BF, 0x001, 0x000, 0x800, 0x380, 0x420]]
    data = pack_e5m6(codes)
    assert data.dtype == torch.uint8 and data.tolist() == [[0x7B, 0x00, 0x0C, 0x3C, 0x08, 0x00, 0x01, 0xF0,
                                                            0x20, 0x04, 0x38, 0x00]]
    assert torch.equal(unpack_e5m6(data), codes)


def test_rounds_to_nearest_even_on_the_low_17_fp32_bits():
    ulp = 2.0 ** -6  # of E5M6 at 1.0
    assert _codes(1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2.0 ** -20) == [0x3C0, 0x3C2, 0x3C1]
    assert _codes(E5M6_MAX, E5M6_MAX + 255.0, E5M6_MAX + 256.0) == [0x7BF, 0x7BF, 0x7C0]  # the tie carries to inf


def test_subnormals_and_underflow():
    assert _codes(2.0 ** -20, 2.0 ** -14 * 63 / 64, 2.0 ** -14, -(2.0 ** -20)) == [0x001, 0x03F, 0x040, 0x801]
    assert _codes(1e-30, -1e-30, 2.0 ** -21) == [0x000, 0x800, 0x000]
    # TileKernels judges the fp32 bits, not the dropped fp16-subnormal bits: 1.5 · 2^-21 stays 0
    assert _codes(1.5 * 2.0 ** -21) == [0x000]


def test_inf_nan_and_overflow():
    assert _codes(float("inf"), float("-inf"), float("nan"), 1e6) == [0x7C0, 0xFC0, 0x7FF, 0x7C0]
    assert _codes(-float("nan")) == [0xFFF]


def test_every_non_nan_code_round_trips():
    codes = torch.arange(4096, dtype=torch.int32)
    values = e5m6_decode(codes)
    keep = ~torch.isnan(values)
    assert int(keep.sum()) == 4096 - 2 * 63
    assert torch.equal(e5m6_encode(values[keep]), codes[keep])
    assert values[0x7BF] == E5M6_MAX and values[0x001] == 2.0 ** -20 and values[0x800].item() == 0.0
    assert torch.signbit(values[0x800])


def test_bf16_input_is_widened_exactly():
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(5)).bfloat16()
    assert torch.equal(e5m6_encode(x), e5m6_encode(x.float()))


def test_pack_round_trips_random_codes():
    codes = torch.randint(0, 4096, (3, 5, 64), generator=torch.Generator().manual_seed(6), dtype=torch.int32)
    data = pack_e5m6(codes)
    assert data.shape == (3, 5, 96)
    assert torch.equal(unpack_e5m6(data), codes)


@pytest.mark.parametrize("call", [lambda: pack_e5m6(torch.zeros(2, 12, dtype=torch.int32)),
                                  lambda: unpack_e5m6(torch.zeros(2, 13, dtype=torch.uint8)),
                                  lambda: unpack_e5m6(torch.zeros(2, 12, dtype=torch.int8)),
                                  lambda: e5m6_encode(torch.zeros(8, dtype=torch.int32)),
                                  lambda: e5m6_decode(torch.zeros(8))])
def test_bad_input_is_refused(call):
    with pytest.raises(LayoutConversionError):
        call()
