"""ASCEND_BF16_KV (Atlas A2/A3's KV-cache Format): FlashMLA's 656-byte rows stored as their exact bf16
values [nope 512 | rope 64]; byte-level known answers, the exact round trip of the values, and the
refusals (a scale that is not a power of two, non-finite values on the way back)."""

import pickle

import pytest
import torch

from portable_kernels.layouts import (ASCEND_BF16_KV, FLASHMLA_FP8_KV, LayoutConversionError, dequantize_fp8_kv_cache,
                                      kv_cache_format_named, pack_fp8_kv_cache)


def _rows(n: int, seed: int, scale_rule: str = "flash_mla") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    kv = (torch.randn(n, 576, generator=g) * torch.logspace(-3, 2, n)[:, None]).to(torch.bfloat16)
    return pack_fp8_kv_cache(kv[:, :512], kv[:, 512:].contiguous(), scale_rule=scale_rule)


def _worked_token() -> torch.Tensor:
    """pack_fp8_kv_cache's docstring token: tile 0 = [448, 1, -2, 0.5, 0...], rope[0] = 1.0."""
    latent = torch.zeros(1, 512)
    latent[0, :4] = torch.tensor([448.0, 1.0, -2.0, 0.5])
    rope = torch.zeros(1, 64, dtype=torch.bfloat16)
    rope[0, 0] = 1.0
    return pack_fp8_kv_cache(latent, rope)


def test_worked_example_bytes():
    # FlashMLA bytes 0..3 = 7e 38 c0 30 (e4m3 448, 1, -2, 0.5) with scale 1.0 (00 00 80 3f at 512)
    row = _worked_token()
    assert row[0, :4].tolist() == [0x7E, 0x38, 0xC0, 0x30]
    values = ASCEND_BF16_KV.encode(row)
    assert values.dtype == torch.bfloat16 and tuple(values.shape) == (1, 576)
    # bf16 little-endian: 448 = 0x43e0, 1 = 0x3f80, -2 = 0xc000, 0.5 = 0x3f00; rope[0] = 1.0 at channel 512
    assert values.view(torch.uint8)[0, :8].tolist() == [0xE0, 0x43, 0x80, 0x3F, 0x00, 0xC0, 0x00, 0x3F]
    assert values.view(torch.uint8)[0, 1024:1026].tolist() == [0x80, 0x3F]
    assert bool((values[0, 4:512] == 0).all()) and bool((values[0, 513:] == 0).all())


def test_values_are_the_rows_dequantized_exactly():
    rows = _rows(64, seed=1)
    values = ASCEND_BF16_KV.encode(rows)
    assert torch.equal(values.float(), dequantize_fp8_kv_cache(rows, torch.float32))


@pytest.mark.parametrize("scale_rule", ["flash_mla", "portable"])
def test_decode_gives_back_the_same_values(scale_rule):
    rows = _rows(64, seed=2, scale_rule=scale_rule)
    values = ASCEND_BF16_KV.encode(rows)
    back = ASCEND_BF16_KV.decode(values)
    assert back.dtype == torch.uint8 and back.shape == rows.shape
    assert torch.equal(dequantize_fp8_kv_cache(back, torch.float32), dequantize_fp8_kv_cache(rows, torch.float32))
    assert torch.equal(ASCEND_BF16_KV.encode(back), values)


def test_decode_keeps_the_rope_bytes():
    rows = _rows(8, seed=3)
    assert torch.equal(ASCEND_BF16_KV.decode(ASCEND_BF16_KV.encode(rows))[:, 528:], rows[:, 528:])


def test_a_scale_that_is_not_a_power_of_two_is_refused():
    row = _worked_token()
    row[0, 512:516] = torch.tensor([0.3], dtype=torch.float32).view(torch.uint8)
    with pytest.raises(LayoutConversionError, match="power of two"):
        ASCEND_BF16_KV.encode(row)


def test_nan_rows_stay_nan_on_the_way_in_and_are_refused_on_the_way_back():
    row = _worked_token()
    row[0, :512] = 0xFF  # e4m3 NaN, as FlashMLA's tests leave unused slots
    values = ASCEND_BF16_KV.encode(row)
    assert bool(torch.isnan(values[0, :512]).all())
    with pytest.raises(LayoutConversionError, match="NaN"):
        ASCEND_BF16_KV.decode(values)


def test_storage_shape_dtype_and_size():
    assert ASCEND_BF16_KV.holds_values and not FLASHMLA_FP8_KV.holds_values
    assert ASCEND_BF16_KV.bytes_per_token == 1152 and FLASHMLA_FP8_KV.bytes_per_token == 656
    pages = ASCEND_BF16_KV.zeros(3, 64)
    assert pages.dtype == torch.bfloat16 and tuple(pages.shape) == (3, 64, 1, 576) and ASCEND_BF16_KV.check(pages) is None
    assert "bfloat16" in ASCEND_BF16_KV.check(FLASHMLA_FP8_KV.zeros(3, 64))
    assert torch.equal(ASCEND_BF16_KV.dequantize(pages, torch.float32), torch.zeros(3, 64, 1, 576))


def test_found_again_by_name_and_pickle():
    assert kv_cache_format_named(ASCEND_BF16_KV.name) is ASCEND_BF16_KV
    assert pickle.loads(pickle.dumps(ASCEND_BF16_KV)) is ASCEND_BF16_KV
