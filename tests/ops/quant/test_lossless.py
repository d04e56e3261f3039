"""per_block_cast_lossless (TileKernels' exact E2M1 -> E4M3 recast): the reference against
independent float64 math, edge codes and scales, refusals naming the argument, and the
tile_kernels drop-in on TileKernels' test grid (shrunk) with its scale storages."""

import pytest
import torch

import portable_kernels.tile_kernels as tk
from portable_kernels.core.errors import ContractError
from portable_kernels.ops.quant.lossless import lossless_cast_reference, per_block_cast_lossless
from portable_kernels.testing.lossless_cases import edge_fp4_input, fp4_input
from portable_kernels.testing.generators import randn

#: E2M1 magnitudes by code (codes 8..15 negative), written out here independently of the layouts
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _values64(data: torch.Tensor, sf: torch.Tensor, block) -> torch.Tensor:
    """float64 values of packed E2M1 (low nibble first) with block scales, by hand."""
    m, k = data.shape[0], data.shape[1] * 2
    b = data.view(torch.uint8).long()
    codes = torch.stack((b & 15, b >> 4), dim=-1).view(m, k)
    mag = torch.tensor(E2M1, dtype=torch.float64)[codes & 7]
    vals = torch.where(codes >= 8, -mag, mag)
    scale = sf.double().repeat_interleave(block[0], 0)[:m].repeat_interleave(block[1], 1)[:, :k]
    return vals * scale


def _fp8_values64(data, sf, block):
    m, k = data.shape
    return data.double() * sf.double().repeat_interleave(block[0], 0)[:m].repeat_interleave(block[1], 1)[:, :k]


@pytest.mark.parametrize(("m", "k", "ib", "ob"), [(64, 256, (1, 32), (1, 128)), (70, 256, (1, 32), (32, 32)),
                                                  (130, 512, (1, 32), (128, 128)), (33, 70, (1, 5), (3, 35))])
def test_reference_keeps_every_value_and_takes_the_largest_scale_over_64(m, k, ib, ob):
    data, sf = fp4_input(m, k, ib, seed=m + k)
    out, out_sf = lossless_cast_reference(data, sf, ib, ob)
    assert out.dtype == torch.float8_e4m3fn and out.shape == (m, k)
    assert torch.equal(_fp8_values64(out, out_sf, ob), _values64(data, sf, ib))
    # the output scale of block (i, j): the largest input scale it covers, / 64 (independent loop)
    rm, rk = ob[0] // ib[0], ob[1] // ib[1]
    for i in range(out_sf.shape[0]):
        for j in range(out_sf.shape[1]):
            top = sf[i * rm:(i + 1) * rm, j * rk:(j + 1) * rk].double().max()
            assert out_sf[i, j].item() == top.item() / 64


def test_edge_codes_and_scales():
    data, sf = edge_fp4_input()
    out, out_sf = per_block_cast_lossless(data, sf, (1, 32), (32, 64))
    assert torch.equal(_fp8_values64(out, out_sf, (32, 64)), _values64(data, sf, (1, 32)))
    raw = out.view(torch.uint8)
    codes = torch.stack((data & 15, data >> 4), dim=-1).view(64, 128)
    assert bool((raw[codes == 8] == 0x80).all()) and bool((raw[codes == 0] == 0).all())  # -0 stays -0
    # in block (0, 0) scales 2^-11 .. 2^0: code 7 (6) under the largest becomes 6 * 2^6 = 384 (0x7C)
    assert int(raw[:32, :64][(codes[:32, :64] == 7) & (sf[:32, :2].repeat_interleave(32, 1) == 1.0)][0]) == 0x7C
    assert out_sf[0, 0].item() == 2.0 ** -6 and out_sf[1, 0].item() == 2.0 ** -126


def _refusal(sf_change, ob=(8, 64)):
    data, sf = fp4_input(8, 64, (1, 32), seed=5)
    sf = sf.clone()
    sf_change(sf)
    with pytest.raises(ContractError, match="'sf'"):
        per_block_cast_lossless(data, sf, (1, 32), ob)


def test_refuses_scales_the_recast_cannot_carry():
    _refusal(lambda sf: sf.__setitem__((1, 0), sf[1, 0] * 1.5))      # not a power of two
    _refusal(lambda sf: sf.__setitem__((2, 1), -sf[2, 1]))           # negative
    _refusal(lambda sf: sf.__setitem__((2, 1), 0.0))                 # zero
    _refusal(lambda sf: sf.__setitem__((2, 1), float("inf")))        # inf
    _refusal(lambda sf: sf.__setitem__((3, 1), sf.max() * 2.0 ** 12))  # more than 2^11 apart
    _refusal(lambda sf: sf.fill_(2.0 ** -121))                       # out scale would be 2^-127
    data, sf = fp4_input(8, 64, (1, 32), seed=5)
    sf = sf.clone()
    sf[3, 1] = sf.max() * 2.0 ** 11  # exactly 2^11 apart: accepted
    sf[3, 0] = sf[3, 1] / 2.0 ** 11
    out, out_sf = per_block_cast_lossless(data, sf, (1, 32), (8, 64))
    assert torch.equal(_fp8_values64(out, out_sf, (8, 64)), _values64(data, sf, (1, 32)))


def test_refuses_bad_arguments_naming_them():
    data, sf = fp4_input(8, 64, (1, 32), seed=6)
    cases = [((data.float(), sf, (1, 32), (1, 64)), "data"), ((data, sf[:, :1], (1, 32), (1, 64)), "sf"),
             ((data, sf.double(), (1, 32), (1, 64)), "sf"), ((data, sf, (1, 32), (1, 48)), "out_block_size"),
             ((data, sf, (1, 0), (1, 64)), "x_block_size"), ((data, sf, (1, 32), 64), "out_block_size")]
    for args, arg in cases:
        with pytest.raises(ContractError, match=f"'{arg}"):
            per_block_cast_lossless(*args)


@pytest.mark.parametrize("in_flags", [(False, True, False), (True, True, True)])
@pytest.mark.parametrize("out_flags", [(False, True, False), (True, True, True)])
@pytest.mark.parametrize("ob", [(1, 128), (32, 32), (128, 128)])
@pytest.mark.parametrize(("tokens", "hidden"), [(257, 576), (40, 2048)])
def test_drop_in_on_tilekernels_grid(tokens, hidden, ob, in_flags, out_flags):
    x = randn(tokens, hidden, seed=tokens + hidden)
    floor = x.abs().max() / 2 ** 9
    x = torch.sign(x) * torch.maximum(x.abs(), floor)  # TileKernels' clamp_abs_ratio
    col, rnd, packed = in_flags
    x_fp4 = tk.quant.per_block_cast(x, "e2m1", (1, 32), use_tma_aligned_col_major_sf=col, round_sf=rnd,
                                    use_packed_ue8m0=packed)
    col, rnd, packed = out_flags
    x_fp8 = tk.quant.per_block_cast_lossless(x_fp4, "e4m3", x_block_size=(1, 32), out_block_size=ob,
                                             use_tma_aligned_col_major_sf=col, round_sf=rnd,
                                             use_packed_ue8m0=packed)
    assert x_fp8[0].dtype == torch.float8_e4m3fn and x_fp8[0].shape == (tokens, hidden)
    if packed:
        assert x_fp8[1].dtype == torch.int32
    elif col:
        assert x_fp8[1].stride(0) == 1
    back = tk.quant.cast_back(x_fp8, "fp32", ob)
    assert torch.equal(back, tk.quant.cast_back(x_fp4, "fp32", (1, 32)))


def test_drop_in_refusals_name_x_or_the_flag():
    x_fp4 = tk.quant.per_block_cast(randn(8, 64, seed=9), "e2m1", (1, 32), round_sf=True)
    with pytest.raises(ContractError, match="'fmt'"):
        tk.quant.per_block_cast_lossless(x_fp4, "e2m1", (1, 32), (1, 64))
    with pytest.raises(ContractError, match="'x'"):
        tk.quant.per_block_cast_lossless(x_fp4[0], "e4m3", (1, 32), (1, 64))
    with pytest.raises(ContractError, match="'use_packed_ue8m0'"):
        tk.quant.per_block_cast_lossless(x_fp4, "e4m3", (1, 32), (1, 64), use_packed_ue8m0=True)
    bad = (x_fp4[0], x_fp4[1] * 1.5)
    with pytest.raises(ContractError, match="'x' \\(sf\\)"):
        tk.quant.per_block_cast_lossless(bad, "e4m3", (1, 32), (1, 64))
