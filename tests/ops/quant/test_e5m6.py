"""per_token_cast_to_e5m6's contract (reference) and e5m6_cast_back: scales, precision of the round
trip, and bad input naming the argument."""

import pytest
import torch

import portable_kernels as pk
from portable_kernels.core.numerics import calc_diff
from portable_kernels.layouts.e5m6 import E5M6_MAX, e5m6_decode, unpack_e5m6
from portable_kernels.ops.quant.e5m6 import e5m6_cast_back, e5m6_cast_reference
from portable_kernels.testing.generators import randn


def test_reference_scales_follow_tilekernels_rule():
    x = randn(6, 256, seed=1)
    data, sf = e5m6_cast_reference(x, 64, False)
    amax = x.view(6, 4, 64).abs().amax(-1)
    assert data.shape == (6, 384) and torch.equal(sf, amax / torch.full_like(amax, E5M6_MAX))
    _, sf2 = e5m6_cast_reference(x, 64, True)
    assert bool(((sf2.view(torch.int32) & 0x807FFFFF) == 0).all()) and bool((sf2 >= sf).all())
    assert bool((sf2 < 2 * sf).all())


def test_each_block_max_becomes_the_top_code():
    x = randn(5, 128, seed=2)
    data, _ = e5m6_cast_reference(x, 128, False)
    codes = e5m6_decode(unpack_e5m6(data)).abs().amax(-1)
    assert torch.equal(codes, torch.full((5,), E5M6_MAX))


@pytest.mark.parametrize("round_sf", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_within_the_format_precision(round_sf, out_dtype):
    x = randn(64, 1024, seed=3, scale=3.0)
    data, sf = pk.per_token_cast_to_e5m6(x, 128, round_sf)
    back = e5m6_cast_back(data, sf, (1, 128), out_dtype)
    assert back.dtype == out_dtype and back.shape == x.shape
    rel = ((back.float() - x).abs() / x.abs()).max()
    # 6 mantissa bits: half an ulp is 2^-7 relative (plus bf16's 2^-9 when the output is bf16)
    assert rel <= 2.0 ** -7 + (2.0 ** -8 if out_dtype == torch.bfloat16 else 1e-7)
    assert calc_diff(back.float(), x) < 1e-4


def test_amax_floor_sets_the_scale_of_a_zero_block():
    x = torch.zeros(2, 64)
    x[1] = randn(64, seed=4)
    _, sf = pk.per_token_cast_to_e5m6(x, 64)
    assert sf[0, 0] == torch.tensor(1e-4) / E5M6_MAX


@pytest.mark.parametrize(("kwargs", "arg"), [
    (dict(x=torch.zeros(4, 64, dtype=torch.int32), num_per_channels=64), "x"),
    (dict(x=torch.zeros(2, 4, 64), num_per_channels=64), "x"),
    (dict(x=torch.ones(4, 60), num_per_channels=60), "x"),
    (dict(x=torch.ones(4, 64), num_per_channels=0), "num_per_channels"),
    (dict(x=torch.ones(4, 64), num_per_channels=64, round_sf=1), "round_sf"),
])
def test_cast_bad_input_names_the_argument(kwargs, arg):
    with pytest.raises(pk.ContractError, match=f"'{arg}'"):
        pk.per_token_cast_to_e5m6(**kwargs)


@pytest.mark.parametrize(("args", "arg"), [
    ((torch.zeros(4, 96, dtype=torch.int8), torch.ones(4, 1), (1, 64)), "data"),
    ((torch.zeros(4, 90, dtype=torch.uint8), torch.ones(4, 1), (1, 64)), "data"),
    ((torch.zeros(4, 96, dtype=torch.uint8), torch.ones(4, 2), (1, 64)), "sf"),
    ((torch.zeros(4, 96, dtype=torch.uint8), torch.ones(4, 1, dtype=torch.float64), (1, 64)), "sf"),
    ((torch.zeros(4, 96, dtype=torch.uint8), torch.ones(4, 1), (0, 64)), "block\\[0\\]"),
])
def test_cast_back_bad_input_names_the_argument(args, arg):
    with pytest.raises(pk.ContractError, match=f"'{arg}'"):
        e5m6_cast_back(*args)


def test_cast_back_refuses_fp16_output():
    with pytest.raises(pk.ContractError, match="'out_dtype'"):
        e5m6_cast_back(torch.zeros(4, 96, dtype=torch.uint8), torch.ones(4, 1), (1, 64), torch.float16)
