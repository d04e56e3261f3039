"""TileKernels' E5M6 casts through the drop-in: per_token_cast(x, 'e5m6', ...) and
cast_back(..., x_special_fmt='e5m6') with upstream's test grid (shrunk), storage flags and refusals."""

import pytest
import torch

import portable_kernels as pk
from portable_kernels import tile_kernels
from portable_kernels.ops.quant.e5m6 import e5m6_cast_reference
from portable_kernels.tile_kernels.testing.generator import generate_e5m6_inputs
from portable_kernels.tile_kernels.testing.numeric import calc_diff

#: upstream's flag combinations (use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0), plus plain fp32 sf
FLAGS = [(False, True, False), (True, True, True), (False, False, False)]
#: (num_tokens, hidden): upstream's hidden sizes, fewer tokens
SHAPES = [(33, 7168), (5, 2048), (1, 576)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize(("num_tokens", "hidden"), SHAPES)
def test_e5m6_cast_and_cast_back_as_upstream(num_tokens, hidden, flags, dtype):
    col_major, round_sf, packed = flags
    torch.manual_seed(num_tokens + hidden)
    for x, is_special in generate_e5m6_inputs(num_tokens, hidden, dtype, device="cpu"):
        data, sf = tile_kernels.quant.per_token_cast(x, "e5m6", num_per_channels=hidden,
                                                     use_tma_aligned_col_major_sf=col_major, round_sf=round_sf,
                                                     use_packed_ue8m0=packed)
        ref_data, ref_sf = e5m6_cast_reference(x, hidden, round_sf)
        assert data.dtype == torch.uint8 and data.shape == (num_tokens, hidden * 3 // 2)
        assert torch.equal(data, ref_data)
        if packed:
            assert sf.dtype == torch.int32 and sf.shape == (num_tokens, 1)
            assert sf.stride() == (1, -(-num_tokens // 4) * 4)
            assert torch.equal((sf & 0xFF) << 23, ref_sf.view(torch.int32))  # one exponent byte per row, low byte
        else:
            assert sf.dtype == torch.float32 and torch.equal(sf, ref_sf)
            if col_major:
                assert sf.stride() == (1, -(-num_tokens // 4) * 4)
        for fmt, out_dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            back = tile_kernels.quant.cast_back((data, sf), fmt, (1, hidden), x_special_fmt="e5m6")
            assert back.dtype == out_dtype and back.shape == x.shape
            assert calc_diff(x, back) < (5e-6 if is_special else 1e-4)
            same = tile_kernels.quant.per_token_cast_back((data, sf), fmt, hidden, x_special_fmt="e5m6")
            assert torch.equal(same, back)


def test_per_token_cast_back_with_several_blocks_per_row():
    x = torch.randn(9, 512, generator=torch.Generator().manual_seed(3))
    data, sf = tile_kernels.quant.per_token_cast(x, "e5m6", 128, use_tma_aligned_col_major_sf=True, round_sf=True,
                                                 use_packed_ue8m0=True)
    back = tile_kernels.quant.per_token_cast_back((data, sf), "fp32", 128, x_special_fmt="e5m6")
    assert calc_diff(x, back) < 1e-4


@pytest.mark.parametrize(("call", "arg"), [
    (lambda x: tile_kernels.quant.per_token_cast(x.half(), "e5m6", 64), "x"),
    (lambda x: tile_kernels.quant.per_token_cast(x[:, :60], "e5m6", 60), "x"),
    (lambda x: tile_kernels.quant.per_token_cast(x, "e5m6", 64, x_block_size=(1, 64)), "x_block_size"),
    (lambda x: tile_kernels.quant.per_token_cast(x, "e5m6", 64, use_packed_ue8m0=True), "use_packed_ue8m0"),
    (lambda x: tile_kernels.quant.per_token_cast_with_sf_only(x, "e5m6", 64), "fmt"),
    (lambda x: tile_kernels.quant.per_block_cast(x, "e5m6", (1, 64)), "fmt"),
    (lambda x: tile_kernels.quant.cast_back(tile_kernels.quant.per_token_cast(x, "e5m6", 64), "bf16", (1, 64),
                                            x_special_fmt="e3m6"), "x_special_fmt"),
    (lambda x: tile_kernels.quant.cast_back((torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 1)), "bf16",
                                            (1, 64), x_special_fmt="e5m6"), "x"),
    (lambda x: tile_kernels.quant.cast_back((tile_kernels.quant.per_token_cast(x, "e5m6", 64)[0], torch.ones(4, 3)),
                                            "bf16", (1, 64), x_special_fmt="e5m6"), "x"),
])
def test_e5m6_bad_input_names_the_argument(call, arg):
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(4))
    with pytest.raises(pk.ContractError, match=f"'{arg}'"):
        call(x)
