"""The Triton block_cast kernel (TileKernels' cast rule) against the contract's reference, byte for
byte (the contract's tolerance on the dequantized values is 0)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import portable_kernels as pk  # noqa: E402
from portable_kernels.backends.nvidia.kernels import block_cast as kernel  # noqa: E402
from portable_kernels.core.dispatch import trace_providers  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.ops.quant.block_cast import DEFAULT_CLAMP_MIN, block_cast_reference  # noqa: E402
from portable_kernels.testing.generators import randn  # noqa: E402


def _same(got: tuple, want: tuple) -> bool:
    """Data bytes equal and scales equal bit for bit (NaN included)."""
    return (torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
            and torch.equal(got[1].view(torch.int32), want[1].view(torch.int32)))


CASTS = [  # (M, K), block
    ((5, 256), (1, 128)),     # per token
    ((3, 300), (1, 32)),      # partial trailing block
    ((130, 300), (128, 128)),  # per block, partial in both directions
    ((130, 8), (128, 1)),     # per channel
    ((20, 10), (1, 1)),       # one element per block
    ((17, 50), (4, 6)),       # small blocks, several per tile
    ((9, 6), (3, 1)),
]


@pytest.mark.parametrize("shape,block", CASTS, ids=str)
@pytest.mark.parametrize("element", ["e4m3", "e2m1"])
@pytest.mark.parametrize("round_sf", [False, True])
def test_block_cast_is_the_reference_byte_for_byte(shape, block, element, round_sf):
    m, k = shape
    x = randn(m, k, seed=m * 7 + k, scale=3.0).bfloat16()
    x[0] = 0  # an all-zero row: the amax floor decides its scales
    floor = DEFAULT_CLAMP_MIN[element]
    data, sf, refused = kernel.block_cast(x, block, element, round_sf, floor)
    assert not bool(refused)
    assert _same((data, sf), block_cast_reference(x, block, element, round_sf, floor))


@pytest.mark.parametrize("element", ["e4m3", "e2m1"])
def test_block_cast_reads_fp32_and_strided_input(element):
    x = randn(96, 40, seed=3).T  # [40, 96], column stride 40
    data, sf, _ = kernel.block_cast(x, (8, 32), element, False, 1e-4)
    assert _same((data, sf), block_cast_reference(x.contiguous(), (8, 32), element, False, 1e-4))


@pytest.mark.parametrize("element", ["e4m3", "e2m1"])
@pytest.mark.parametrize("block", [(1, 128), (128, 1), (2, 16)])
def test_block_cast_with_given_scales_casts_only(element, block):
    x = randn(34, 256, seed=4)
    sf = randn(-(-34 // block[0]), -(-256 // block[1]), seed=5).abs() + 0.05
    data, out_sf, refused = kernel.block_cast(x, block, element, False, 1e-4, sf=sf)
    assert not bool(refused) and torch.equal(out_sf, sf)
    assert _same((data, out_sf), block_cast_reference(x, block, element, False, 1e-4, sf=sf))


def test_block_cast_clamp_min_above_every_amax():
    x = randn(16, 256, seed=6, scale=1e-3)
    got = kernel.block_cast(x, (1, 128), "e4m3", True, 1.0)
    assert _same(got[:2], block_cast_reference(x, (1, 128), "e4m3", True, 1.0))


def test_block_cast_e4m3_lets_nan_propagate_into_its_block():
    x = randn(4, 256, seed=7)
    x[1, 5] = float("nan")
    data, sf, refused = kernel.block_cast(x, (1, 128), "e4m3", False, 1e-4)
    assert not bool(refused) and bool(sf[1, 0].isnan()) and not bool(sf[1, 1].isnan())
    assert _same((data, sf), block_cast_reference(x, (1, 128), "e4m3", False, 1e-4))


@pytest.mark.parametrize("element,round_sf,bad", [("e4m3", True, float("nan")), ("e4m3", True, float("inf")),
                                                  ("e2m1", False, float("inf")), ("e2m1", True, float("nan"))])
def test_block_cast_flags_what_the_contract_refuses(element, round_sf, bad):
    x = randn(130, 64, seed=8)
    x[129, 3] = bad
    for block in ((1, 32), (128, 32)):
        assert bool(kernel.block_cast(x, block, element, round_sf, 1e-4)[2])


def test_block_cast_flags_e2m1_codes_that_overflow_given_scales():
    x = randn(4, 64, seed=9, scale=100.0)
    sf = torch.full((4, 2), 1e-37)  # |x| / sf past the fp32 range: codes of inf
    assert bool(kernel.block_cast(x, (1, 32), "e2m1", False, 1e-4, sf=sf)[2])


def test_block_cast_rejects_blocks_it_does_not_hold():
    x = randn(4, 512, seed=10)
    with pytest.raises(ContractError, match="block"):
        kernel.block_cast(x, (1, 256), "e4m3", False, 1e-4)
    with pytest.raises(ContractError, match="block"):
        kernel.block_cast(x, (1, 3), "e2m1", False, 1e-4)


# -- the public op on the nvidia backend ----------------------------------------------------------

def test_public_block_cast_runs_on_triton_and_wide_blocks_on_the_oracle():
    x = randn(6, 512, seed=11).bfloat16()
    with pk.use_backend("nvidia"), trace_providers() as ran:
        q = pk.block_cast(x, "e4m3", (1, 128), True)
        wide = pk.block_cast(x, "e4m3", (1, 512))
    assert ran == [("block_cast", "nvidia", "triton"), ("block_cast", "nvidia", "layout-reference")]
    assert _same((q.data, q.scale), block_cast_reference(x, (1, 128), "e4m3", True, DEFAULT_CLAMP_MIN["e4m3"]))
    assert _same((wide.data, wide.scale), block_cast_reference(x, (1, 512), "e4m3", False, DEFAULT_CLAMP_MIN["e4m3"]))


def test_public_block_cast_refuses_nan_with_round_sf_on_triton():
    x = randn(4, 64, seed=12)
    x[2, 7] = float("nan")
    with pk.use_backend("nvidia"), trace_providers() as ran, pytest.raises(ContractError, match="x"):
        pk.block_cast(x, "e4m3", (1, 32), True)
    assert ran == [("block_cast", "nvidia", "triton")]
