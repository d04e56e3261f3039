"""FlashMLA's MODEL1 FP8 KV cache pages (layouts/kv_cache_model1.py): the worked example of
docs/formats-model1.md byte for byte, the page layout (values first, then scales), both scale rules,
dequantization, per-token gathers and the shape / stride refusals."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.layouts import (FLASHMLA_MODEL1_FP8_KV, MODEL1_BYTES_PER_TOKEN, dequantize_model1_kv_cache,
                                      known_kv_cache_formats, model1_kv_tokens, model1_token_rows,
                                      pack_model1_kv_cache)
from portable_kernels.layouts.errors import LayoutConversionError
from portable_kernels.layouts.kv_cache_model1 import model1_cache_problem
from portable_kernels.testing.generators import randn


def _worked_example() -> torch.Tensor:
    """docs/formats-model1.md: one page of 2 tokens."""
    k = torch.zeros(1, 2, 1, 512)
    k[0, 0, 0, :4] = torch.tensor([448.0, 1.0, -2.0, 0.5])   # token 0, tile 0 (amax 448 -> sf 1)
    k[0, 0, 0, 448] = 1.0                                    # token 0, rope[0]
    k[0, 1, 0, 64] = 3.0                                     # token 1, tile 1 (amax 3 -> sf 2^-7)
    k[0, 1, 0, 511] = -2.0                                   # token 1, rope[63]
    return k.to(torch.bfloat16)


def test_worked_example_bytes_flash_mla_rule():
    page = pack_model1_kv_cache(_worked_example()).view(-1)
    assert page.shape == (2 * MODEL1_BYTES_PER_TOKEN,)
    want = torch.zeros(2 * 584, dtype=torch.uint8)
    want[0:4] = torch.tensor([0x7E, 0x38, 0xC0, 0x30])        # 448, 1, -2, 0.5 as e4m3
    want[448:450] = torch.tensor([0x80, 0x3F])               # rope[0] = 1.0 bf16
    want[576 + 64] = 0x7C                                    # token 1 value 64: 3 / 2^-7 = 384 = 1.5·2^8 -> 0x7c
    want[576 + 574:576 + 576] = torch.tensor([0x00, 0xC0])   # token 1 rope[63] = -2.0 bf16
    want[1152:1160] = torch.tensor([0x7F, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x00])  # token 0: 2^0, then 2^-13
    want[1160:1168] = torch.tensor([0x72, 0x78, 0x72, 0x72, 0x72, 0x72, 0x72, 0x00])  # token 1: tile 1 2^-7
    assert torch.equal(page, want)


def test_portable_rule_clamps_the_amax_so_an_all_zero_tile_gets_two_to_the_minus_22():
    page = pack_model1_kv_cache(_worked_example(), scale_rule="portable").view(-1)
    assert page[1152:1160].tolist() == [0x7F, 0x69, 0x69, 0x69, 0x69, 0x69, 0x69, 0x00]
    assert torch.equal(page[:1152], pack_model1_kv_cache(_worked_example()).view(-1)[:1152])


def test_values_of_a_page_come_first_then_every_tokens_scales():
    k = randn(3, 5, 1, 512, seed=1, dtype=torch.bfloat16)
    cache = pack_model1_kv_cache(k)
    pages = cache.view(3, -1)
    for t in range(5):
        rope = pages[:, t * 576 + 448:(t + 1) * 576].contiguous().view(torch.bfloat16)
        assert torch.equal(rope, k[:, t, 0, 448:])
        scales = pages[:, 5 * 576 + 8 * t:5 * 576 + 8 * t + 8]
        assert bool((scales[:, 7] == 0).all())               # the pad byte
        sf = scales[:, :7].contiguous().view(torch.float8_e8m0fnu).float()
        amax = k[:, t, 0, :448].float().view(3, 7, 64).abs().amax(-1)
        assert bool((sf >= amax / 448).all()) and bool((sf < 2 * amax / 448).all())


def test_dequantize_is_e4m3_times_the_tile_scale_and_the_rope_unchanged():
    k = randn(2, 64, 1, 512, seed=2, dtype=torch.bfloat16)
    cache = pack_model1_kv_cache(k)
    back = dequantize_model1_kv_cache(cache, torch.float32)
    assert back.shape == (2, 64, 1, 512)
    assert torch.equal(back[..., 448:], k[..., 448:].float())
    assert pk.calc_diff(back[..., :448], k[..., :448].float()) < 1e-3
    # exact: the dequantized values quantize to the same values again (the bytes may take a smaller scale)
    again = dequantize_model1_kv_cache(pack_model1_kv_cache(back.to(torch.bfloat16)), torch.float32)
    assert torch.equal(again, back)
    assert torch.equal(dequantize_model1_kv_cache(cache), back.to(torch.bfloat16))


def test_flash_mla_rule_passes_nan_through_and_the_portable_rule_refuses_it():
    k = randn(1, 4, 1, 512, seed=3, dtype=torch.bfloat16)
    k[0, 2, 0, 70] = float("nan")
    cache = pack_model1_kv_cache(k)
    back = dequantize_model1_kv_cache(cache, torch.float32)
    assert bool(back[0, 2, 0, 64:128].isnan().all())          # the NaN's tile
    assert not bool(back[0, 2, 0, :64].isnan().any()) and not bool(back[0, 1].isnan().any())
    with pytest.raises(LayoutConversionError, match="NaN"):
        pack_model1_kv_cache(k, scale_rule="portable")


def test_tokens_are_gathered_by_block_and_offset_not_by_row():
    k = randn(4, 3, 1, 512, seed=4, dtype=torch.bfloat16)
    cache = pack_model1_kv_cache(k)
    blocks, offsets = torch.tensor([[3, 0], [1, 3]]), torch.tensor([[2, 0], [1, 1]])
    got = model1_kv_tokens(cache, blocks, offsets)
    assert got.shape == (2, 2, 1, 512)
    assert torch.equal(got, dequantize_model1_kv_cache(cache, torch.float32)[blocks, offsets])
    # a token's 584 bytes are a page of block size 1
    rows = model1_token_rows(cache, blocks, offsets)
    assert torch.equal(dequantize_model1_kv_cache(rows.view(4, 1, 1, 584), torch.float32).view(2, 2, 1, 512), got)


def test_a_padded_page_stride_reads_the_same_tokens():
    k = randn(3, 2, 1, 512, seed=5, dtype=torch.bfloat16)
    cache = pack_model1_kv_cache(k)
    padded = torch.full((3, 1728), 0xFF, dtype=torch.uint8)   # FlashMLA's test pads pages to 576-byte multiples
    padded[:, :1168] = cache.view(3, -1)
    view = padded[:, :1168].view(3, 2, 1, 584)
    assert view.stride(0) == 1728 and model1_cache_problem(view) is None
    assert torch.equal(dequantize_model1_kv_cache(view), dequantize_model1_kv_cache(cache))


def test_the_format_value_is_registered_and_reads_whole_pages():
    assert known_kv_cache_formats()[FLASHMLA_MODEL1_FP8_KV.name] is FLASHMLA_MODEL1_FP8_KV
    assert FLASHMLA_MODEL1_FP8_KV.paged and FLASHMLA_MODEL1_FP8_KV.head_dim == 512
    assert FLASHMLA_MODEL1_FP8_KV.bytes_per_token == 584
    cache = pack_model1_kv_cache(randn(2, 3, 1, 512, seed=6, dtype=torch.bfloat16))
    assert FLASHMLA_MODEL1_FP8_KV.check(cache) is None
    assert FLASHMLA_MODEL1_FP8_KV.decode(FLASHMLA_MODEL1_FP8_KV.encode(cache)) is cache
    assert torch.equal(FLASHMLA_MODEL1_FP8_KV.dequantize(cache, torch.float32),
                       dequantize_model1_kv_cache(cache, torch.float32))


@pytest.mark.parametrize("shape,match", [((2, 4, 1, 576), r"\[num_blocks, block_size, 1, 512\]"),
                                         ((2, 4, 2, 512), r"\[num_blocks, block_size, 1, 512\]")])
def test_pack_refuses_another_head_dim(shape, match):
    with pytest.raises(LayoutConversionError, match=match):
        pack_model1_kv_cache(torch.ones(shape, dtype=torch.bfloat16))


def test_wrong_token_size_and_split_pages_are_refused_with_the_reason():
    assert "584" in model1_cache_problem(torch.zeros(2, 4, 1, 656, dtype=torch.uint8))
    split = torch.zeros(2, 4, 2, 584, dtype=torch.uint8)[:, :, :1]   # tokens 2·584 bytes apart
    assert "stride(1) = 584" in model1_cache_problem(split)
    with pytest.raises(LayoutConversionError, match="MODEL1"):
        dequantize_model1_kv_cache(split)
    with pytest.raises(LayoutConversionError, match="scale_rule"):
        pack_model1_kv_cache(torch.ones(1, 1, 1, 512), scale_rule="nearest")
