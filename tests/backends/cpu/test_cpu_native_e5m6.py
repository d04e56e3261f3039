"""The cpu backend's native E5M6 cast (casts.cpp) against the contract's reference, bit for bit."""

import pytest
import torch

import portable_kernels as pk
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.layouts.e5m6 import E5M6_MAX
from portable_kernels.ops.quant.e5m6 import e5m6_cast_reference
from portable_kernels.testing.generators import randn

SHAPES = [(33, 7168, 7168), (5, 200, 64), (7, 256, 48), (1, 8, 8), (130, 1024, 128)]


def _assert_same(got, want):
    assert got[0].dtype == torch.uint8 and torch.equal(got[0], want[0])
    assert got[1].dtype == torch.float32 and torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))


def _cast(x, per, round_sf):
    with trace_providers() as ran:
        got = pk.per_token_cast_to_e5m6(x, per, round_sf)
    assert ran == [("per_token_cast_to_e5m6", "cpu", "native")]
    return got


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("round_sf", [False, True])
@pytest.mark.parametrize(("m", "k", "per"), SHAPES)
def test_native_cast_equals_the_reference(m, k, per, round_sf, dtype):
    seed = m * 31 + k + per + round_sf
    spread = torch.exp2(torch.randint(-8, 9, (m, 1), generator=torch.Generator().manual_seed(seed)).float())
    x = (randn(m, k, seed=seed) * spread).to(dtype)
    x[0, : min(per, k)] = 0  # the amax floor
    _assert_same(_cast(x, per, round_sf), e5m6_cast_reference(x, per, round_sf))


@pytest.mark.parametrize("round_sf", [False, True])
@pytest.mark.parametrize("value", [2.0 ** -20, 2.0 ** -14 * 63 / 64, 2.0 ** -14, 1e-30, 3e-8, E5M6_MAX])
def test_native_cast_edge_values(value, round_sf):
    x = torch.full((4, 64), value)
    x[:, -1] = E5M6_MAX
    x[1] = -x[1]
    x[2, 3] = -0.0
    x[3, 7] = E5M6_MAX * (1 + 2.0 ** -9)  # scaled back to 65024 · (1 + tiny): rounding at the top code
    _assert_same(_cast(x, 32, round_sf), e5m6_cast_reference(x, 32, round_sf))


def test_native_cast_nan_and_inf_propagate_without_round_sf():
    x = randn(4, 64, seed=11)
    x[1, 5] = float("nan")
    x[2, 7] = float("inf")
    x[2, 9] = -float("nan")
    x[3, 40] = -float("inf")
    got = _cast(x, 32, False)
    _assert_same(got, e5m6_cast_reference(x, 32, False))
    assert torch.isnan(got[1][1, 0]) and torch.isnan(got[1][2, 0]) and torch.isinf(got[1][3, 1])


def test_native_cast_refuses_nan_inf_with_round_sf():
    x = randn(4, 64, seed=12)
    x[2, 40] = float("inf")
    with pytest.raises(pk.ContractError, match="'x'"):
        _cast(x, 32, True)


def test_native_cast_reads_strided_input():
    x = randn(16, 512, seed=13).bfloat16()[:, ::2]
    _assert_same(_cast(x, 128, True), e5m6_cast_reference(x, 128, True))
