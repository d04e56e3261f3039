"""The KV-cache Formats: FlashMLA's row is the identity, CANN's order moves the three parts; both
round-trip any bytes exactly and are found again by name (pickling)."""

import pickle

import torch

from portable_kernels.layouts import (ASCEND_FP8_KV, FLASHMLA_FP8_KV, dequantize_fp8_kv_cache, known_kv_cache_formats,
                                      pack_fp8_kv_cache)


def _random_rows(*lead: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (*lead, 656), generator=g, dtype=torch.uint8)


def test_every_byte_order_round_trips_any_bytes_exactly():
    # the values storage (ASCEND_BF16_KV) is not a byte order: its tests are in test_layouts_kv_cache_bf16_values;
    # MODEL1's pages (another head dim, no other order) in test_layouts_kv_cache_model1
    rows = _random_rows(3, 5, 1, seed=1)
    orders = [fmt for fmt in known_kv_cache_formats().values() if not fmt.holds_values and not fmt.paged]
    assert FLASHMLA_FP8_KV in orders and ASCEND_FP8_KV in orders
    for fmt in orders:
        assert torch.equal(fmt.decode(fmt.encode(rows)), rows)


def test_ascend_order_puts_rope_at_512_and_scales_at_640():
    rows = _random_rows(2, seed=2)
    cann = ASCEND_FP8_KV.encode(rows)
    assert torch.equal(cann[:, :512], rows[:, :512])
    assert torch.equal(cann[:, 512:640], rows[:, 528:656])
    assert torch.equal(cann[:, 640:656], rows[:, 512:528])


def test_flashmla_format_is_the_logical_rows_unchanged():
    rows = _random_rows(4, seed=3)
    assert FLASHMLA_FP8_KV.encode(rows) is rows


def test_dequantize_reads_each_order_to_the_same_values():
    kv = torch.randn(6, 576).to(torch.bfloat16)
    rows = pack_fp8_kv_cache(kv[:, :512], kv[:, 512:], scale_rule="flash_mla")
    assert torch.equal(ASCEND_FP8_KV.dequantize(ASCEND_FP8_KV.encode(rows)), dequantize_fp8_kv_cache(rows))


def test_kv_formats_pickle_by_name_to_the_same_object():
    assert pickle.loads(pickle.dumps(ASCEND_FP8_KV)) is ASCEND_FP8_KV
