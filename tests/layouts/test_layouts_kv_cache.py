"""FlashMLA V3.2 FP8 KV cache: 656-byte tokens, known bytes, round trips, refusals."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layouts_gen import generator, seeds
from portable_kernels.layouts import (
    KV_FP8_BYTES_PER_TOKEN,
    LayoutConversionError,
    dequantize_fp8_kv_cache,
    is_power_of_two,
    pack_fp8_kv_cache,
    unpack_fp8_kv_cache,
)

FAST = settings(max_examples=25, deadline=None, derandomize=True)


def _token():
    latent = torch.zeros(512)
    latent[0:4] = torch.tensor([448.0, 1.0, -2.0, 0.5])  # tile 0: amax 448 -> sf 1
    # tile 1 (128..255) all zero: amax clamped to 1e-4 -> sf = ceil_pow2(1e-4 / 448) = 2^-22
    latent[256:259] = torch.tensor([500.0, 250.0, -3.0])  # tile 2: sf = ceil_pow2(500 / 448) = 2
    latent[384] = -0.001  # tile 3: sf = ceil_pow2(0.001 / 448) = 2^-18; q = -262.1 -> -256
    rope = torch.zeros(64, dtype=torch.bfloat16)
    rope[0:3] = torch.tensor([1.0, -2.0, 0.5])
    return latent, rope


def test_token_is_656_bytes():
    assert KV_FP8_BYTES_PER_TOKEN == 512 + 4 * 4 + 64 * 2 == 656


def test_pack_known_bytes():
    out = pack_fp8_kv_cache(*_token())
    assert out.dtype == torch.uint8 and out.shape == (656,)
    b = out.tolist()
    assert b[0:4] == [0x7E, 0x38, 0xC0, 0x30]  # e4m3: 448, 1, -2, 0.5
    assert b[128:256] == [0] * 128
    assert b[256:259] == [0x78, 0x70, 0xBC]  # 250 -> 256, 125 -> 128, -1.5
    assert b[384] == 0xF8  # -256
    zeros_elsewhere = b[4:128] + b[259:384] + b[385:512]
    assert zeros_elsewhere == [0] * len(zeros_elsewhere)
    assert b[512:528] == [0x00, 0x00, 0x80, 0x3F,  # 1.0
                          0x00, 0x00, 0x80, 0x34,  # 2^-22
                          0x00, 0x00, 0x00, 0x40,  # 2.0
                          0x00, 0x00, 0x80, 0x36]  # 2^-18   fmt: skip
    assert b[528:534] == [0x80, 0x3F, 0x00, 0xC0, 0x00, 0x3F]  # bf16 1.0, -2.0, 0.5
    assert b[534:656] == [0] * 122


def test_unpack_known_token():
    latent, rope = unpack_fp8_kv_cache(pack_fp8_kv_cache(*_token()))
    assert latent.dtype == torch.float32 and rope.dtype == torch.bfloat16
    assert latent[0:4].tolist() == [448.0, 1.0, -2.0, 0.5]
    assert latent[256:259].tolist() == [512.0, 256.0, -3.0]
    assert latent[384].item() == -256 * 2.0**-18
    assert torch.equal(rope, _token()[1])


def test_dequantize_concatenates_latent_then_rope():
    full = dequantize_fp8_kv_cache(pack_fp8_kv_cache(*_token()))
    assert full.shape == (576,) and full.dtype == torch.bfloat16
    assert full[0].item() == 448.0 and full[512:515].tolist() == [1.0, -2.0, 0.5]


def test_paged_cache_has_token_stride_656():
    g = generator()
    latent = torch.randn(3, 64, 1, 512, generator=g).to(torch.bfloat16)
    rope = torch.randn(3, 64, 1, 64, generator=g).to(torch.bfloat16)
    cache = pack_fp8_kv_cache(latent, rope)
    assert cache.shape == (3, 64, 1, 656) and cache.stride(1) == 656


@FAST
@given(tokens=st.integers(1, 6), log_mag=st.floats(-6, 4), seed=seeds)
def test_round_trip_error_within_half_e4m3_step(tokens, log_mag, seed):
    g = generator(seed)
    x = torch.randn(tokens, 512, generator=g) * 10.0**log_mag
    rope = torch.randn(tokens, 64, generator=g).to(torch.bfloat16)
    packed = pack_fp8_kv_cache(x, rope)
    latent, rope_back = unpack_fp8_kv_cache(packed)
    assert torch.equal(rope_back, rope)
    sf = packed[:, 512:528].contiguous().view(torch.float32)
    assert is_power_of_two(sf)
    sf_per_value = sf.repeat_interleave(128, dim=-1)
    assert bool(((x / sf_per_value).abs() <= 448).all())
    # e4m3 has 3 mantissa bits: relative error <= 2^-4 for normals, absolute <= 2^-10 * sf below 2^-6
    assert bool(((latent - x).abs() <= x.abs() * 2.0**-4 + sf_per_value * 2.0**-10).all())


def test_bf16_dequantization_is_lossless():
    g = generator()
    rope = torch.randn(8, 64, generator=g).to(torch.bfloat16)
    packed = pack_fp8_kv_cache(torch.randn(8, 512, generator=g) * 30, rope)
    as_bf16 = dequantize_fp8_kv_cache(packed, torch.bfloat16)
    assert torch.equal(as_bf16.float(), dequantize_fp8_kv_cache(packed, torch.float32))


def test_out_of_range_values_never_reach_the_cast():
    # torch saturates fp8 casts to +-448 but ml_dtypes gives NaN: the packer must clamp itself
    assert torch.tensor([500.0]).to(torch.float8_e4m3fn).float().item() == 448.0
    x = torch.zeros(512)
    x[0] = 1000.0
    packed = pack_fp8_kv_cache(x, torch.zeros(64, dtype=torch.bfloat16))
    assert packed[0].item() == 0x78 and packed[512:516].tolist() == [0, 0, 0x80, 0x40]  # 1000/4 = 250 -> 256; sf 4


def test_rope_must_already_be_bf16():
    with pytest.raises(LayoutConversionError, match="bf16"):
        pack_fp8_kv_cache(torch.zeros(512), torch.zeros(64))


def test_latent_must_be_512_wide():
    with pytest.raises(LayoutConversionError, match="512"):
        pack_fp8_kv_cache(torch.zeros(576), torch.zeros(64, dtype=torch.bfloat16))


def test_nan_latent_is_refused():
    latent = torch.zeros(512)
    latent[7] = float("nan")
    with pytest.raises(LayoutConversionError, match="NaN"):
        pack_fp8_kv_cache(latent, torch.zeros(64, dtype=torch.bfloat16))


def test_unpack_refuses_wrong_token_size():
    with pytest.raises(LayoutConversionError, match="656"):
        unpack_fp8_kv_cache(torch.zeros(2, 576, dtype=torch.uint8))
