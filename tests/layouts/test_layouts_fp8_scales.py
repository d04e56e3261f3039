"""FP8 scale layouts: grouped known answers, strides and padding, round trips, refusals, large shapes."""

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layouts_gen import groups, k_blocks, mn_sizes, random_pow2_scales, random_scales, same_bits, seeds, storage_bytes
from portable_kernels.layouts import (
    LayoutConversionError,
    ascend_mx_byte_view,
    ascend_mx_decode,
    ascend_mx_encode,
    ascend_mx_encode_from_blocks,
    ascend_mx_kmajor_decode,
    ascend_mx_kmajor_encode,
    broadcast_block_scales_to_rows,
    fp8_scale_from_amax,
    is_ascend_mx_layout,
    is_sm90_sfa_layout,
    is_sm100_ue8m0_layout,
    regranularize_k,
    sm90_sfa_decode,
    sm90_sfa_encode,
    sm90_sfb_decode,
    sm90_sfb_encode,
    sm100_ue8m0_decode,
    sm100_ue8m0_encode,
    sm100_ue8m0_encode_from_blocks,
)

FAST = settings(max_examples=40, deadline=None, derandomize=True)


def _shape(g, mn, kb):
    return (mn, kb) if g is None else (g, mn, kb)


def _align4(x):
    return (x + 3) // 4 * 4


# --- quantization scale rule -----------------------------------------------------------------


def test_fp8_scale_from_amax_divides_by_448_after_clamping_amax():
    amax = torch.tensor([448.0, 0.0, 896.0])
    assert torch.equal(fp8_scale_from_amax(amax), torch.tensor([1.0, 1e-4 / 448, 2.0]))


def test_fp8_scale_from_amax_ue8m0_rounds_up_to_power_of_two():
    amax = torch.tensor([448.0, 0.0, 500.0, 100.0])
    assert fp8_scale_from_amax(amax, use_ue8m0=True).tolist() == [1.0, 2.0**-22, 2.0, 0.25]


# --- SM90 ------------------------------------------------------------------------------------


def test_sm90_sfa_grouped_stride_is_tma_mn_times_sf_k():
    out = sm90_sfa_encode(random_scales((3, 5, 7)))
    assert out.shape == (3, 5, 7) and out.stride() == (8 * 7, 1, 8)


def test_sm90_sfa_grouped_known_bytes_with_pad_rows():
    # G = 2, MN = 1, sf_k = 2: per group two columns of 4 floats (1 row + 3 pad)
    sf = torch.tensor([[[1.0, 2.0]], [[0.5, 4.0]]])
    one, two, half, four = [0, 0, 0x80, 0x3F], [0, 0, 0, 0x40], [0, 0, 0, 0x3F], [0, 0, 0x80, 0x40]
    pad = [0] * 12
    assert storage_bytes(sm90_sfa_encode(sf)) == one + pad + two + pad + half + pad + four + pad


@FAST
@given(g=groups, mn=mn_sizes, kb=k_blocks, seed=seeds)
def test_sm90_sfa_round_trip_and_layout(g, mn, kb, seed):
    sf = random_scales(_shape(g, mn, kb), seed)
    out = sm90_sfa_encode(sf)
    tma = _align4(mn)
    assert out.stride()[-2:] == (1, tma) and is_sm90_sfa_layout(out)
    assert out.untyped_storage().nbytes() == 4 * tma * kb * (1 if g is None else g)
    storage = torch.empty(0, dtype=torch.float32).set_(out.untyped_storage()).view(-1, tma)
    assert not storage[:, mn:].any(), "pad slots must be zero"
    back = sm90_sfa_decode(out)
    assert back.is_contiguous() and same_bits(back, sf)


def test_sm90_sfa_decode_returns_fresh_tensor():
    sf = random_scales((4, 2))
    enc = sm90_sfa_encode(sf)
    assert sm90_sfa_decode(enc).data_ptr() != enc.data_ptr()


def test_is_sm90_sfa_layout_rejects_row_major():
    assert not is_sm90_sfa_layout(random_scales((5, 3)))


def test_sm90_sfb_is_contiguous_copy_as_is():
    sf = random_scales((2, 3, 4))
    out = sm90_sfb_encode(sf)
    assert out.is_contiguous() and same_bits(out, sf) and out.data_ptr() != sf.data_ptr()
    assert same_bits(sm90_sfb_decode(out), sf)


def test_sm90_sfb_encode_makes_transposed_input_contiguous():
    sf = random_scales((4, 3)).t()
    assert sm90_sfb_encode(sf).is_contiguous() and same_bits(sm90_sfb_encode(sf), sf)


def test_sm90_refuses_non_fp32_scales():
    with pytest.raises(LayoutConversionError, match="fp32"):
        sm90_sfa_encode(torch.ones(3, 4, dtype=torch.bfloat16))


# --- broadcast -------------------------------------------------------------------------------


def test_broadcast_row_n_takes_block_n_div_128():
    sf = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    rows = broadcast_block_scales_to_rows(sf, 130)
    assert rows.shape == (130, 2)
    assert rows[127].tolist() == [1.0, 2.0] and rows[128].tolist() == [3.0, 4.0] and rows[129].tolist() == [3.0, 4.0]


def test_broadcast_grouped_with_custom_block():
    sf = torch.tensor([[[1.0], [2.0]], [[3.0], [4.0]]])
    assert broadcast_block_scales_to_rows(sf, 3, block_mn=2)[..., 0].tolist() == [[1.0, 1.0, 2.0], [3.0, 3.0, 4.0]]


def test_broadcast_refuses_wrong_block_count():
    with pytest.raises(LayoutConversionError, match="block rows"):
        broadcast_block_scales_to_rows(torch.ones(2, 2), 300)


# --- SM100 -----------------------------------------------------------------------------------


def test_sm100_grouped_missing_trailing_blocks_are_zero():
    # G = 2, MN = 1, sf_k = 5 -> 2 words per row; tma_mn = 4 -> 8 words per group
    e0 = [2.0**0, 2.0**1, 2.0**2, 2.0**3, 2.0**4]  # 7f 80 81 82 83
    e1 = [2.0**-1] * 5  # 7e
    out = sm100_ue8m0_encode(torch.tensor([[e0], [e1]]))
    assert out.shape == (2, 1, 2) and out.stride() == (8, 1, 4)
    zero_word = [0, 0, 0, 0]
    expected = (
        [0x7F, 0x80, 0x81, 0x82] + zero_word * 3 + [0x83, 0, 0, 0] + zero_word * 3
        + [0x7E] * 4 + zero_word * 3 + [0x7E, 0, 0, 0] + zero_word * 3
    )  # fmt: skip
    assert storage_bytes(out) == expected


@FAST
@given(g=groups, mn=mn_sizes, kb=k_blocks, seed=seeds)
def test_sm100_round_trip_and_layout(g, mn, kb, seed):
    sf = random_pow2_scales(_shape(g, mn, kb), seed)
    out = sm100_ue8m0_encode(sf)
    words, tma = (kb + 3) // 4, _align4(mn)
    assert out.shape[-2:] == (mn, words) and is_sm100_ue8m0_layout(out)
    assert out.untyped_storage().nbytes() == 4 * tma * words * (1 if g is None else g)
    storage = torch.empty(0, dtype=torch.int32).set_(out.untyped_storage()).view(-1, tma)
    assert not storage[:, mn:].any(), "pad rows must be zero"
    assert same_bits(sm100_ue8m0_decode(out, kb), sf)


@FAST
@given(mn=mn_sizes, kb=k_blocks, seed=seeds)
def test_sm100_word_equals_shift_or_formula(mn, kb, seed):
    sf = random_pow2_scales((mn, kb), seed)
    e = (sf.view(torch.int32) >> 23).to(torch.int64)
    e = torch.nn.functional.pad(e, (0, (-kb) % 4))
    w = e[:, 0::4] | e[:, 1::4] << 8 | e[:, 2::4] << 16 | e[:, 3::4] << 24
    w = torch.where(w >= 2**31, w - 2**32, w)
    assert torch.equal(sm100_ue8m0_encode(sf).to(torch.int64), w)


def test_sm100_decode_accepts_contiguous_copy():
    sf = random_pow2_scales((2, 5, 9))
    packed = sm100_ue8m0_encode(sf).contiguous()
    assert same_bits(sm100_ue8m0_decode(packed, 9), sf)


def test_sm100_refuses_non_power_of_two_scales_with_fix():
    with pytest.raises(LayoutConversionError, match="use_ue8m0=True / ceil_to_ue8m0"):
        sm100_ue8m0_encode(random_scales((4, 4)))


def test_sm100_decode_refuses_wrong_word_count():
    packed = sm100_ue8m0_encode(random_pow2_scales((4, 8)))
    with pytest.raises(LayoutConversionError, match="words per row"):
        sm100_ue8m0_decode(packed, 9)


def test_sm100_decode_refuses_nonzero_bytes_past_num_k_blocks():
    packed = sm100_ue8m0_encode(random_pow2_scales((4, 8)))
    with pytest.raises(LayoutConversionError, match="beyond num_k_blocks"):
        sm100_ue8m0_decode(packed, 7)


@FAST
@given(g=groups, mn=st.integers(1, 300), block_mn=st.sampled_from([1, 2, 128]), kb=k_blocks, seed=seeds)
def test_sm100_from_blocks_equals_broadcast_then_encode(g, mn, block_mn, kb, seed):
    blocks = random_pow2_scales(_shape(g, (mn + block_mn - 1) // block_mn, kb), seed)
    fused = sm100_ue8m0_encode_from_blocks(blocks, mn, block_mn)
    plain = sm100_ue8m0_encode(broadcast_block_scales_to_rows(blocks, mn, block_mn))
    assert fused.stride() == plain.stride() and storage_bytes(fused) == storage_bytes(plain)


def test_sm100_from_blocks_refuses_non_power_of_two():
    with pytest.raises(LayoutConversionError, match="powers of two"):
        sm100_ue8m0_encode_from_blocks(random_scales((2, 3)), 256)


def test_sm100_large_grouped_weight_scales_encode_quickly():
    # 256 experts of a 7168 x 2048 weight: 128x128 block scales [256, 56, 16] -> per row [256, 7168, 16]
    blocks = random_pow2_scales((256, 56, 16))
    start = time.perf_counter()
    packed = sm100_ue8m0_encode_from_blocks(blocks, 7168)
    elapsed = time.perf_counter() - start
    assert packed.shape == (256, 7168, 4) and is_sm100_ue8m0_layout(packed)
    assert same_bits(sm100_ue8m0_decode(packed[255], 16)[7000], blocks[255, 7000 // 128])
    assert elapsed < 5.0


# --- regranularize -------------------------------------------------------------------------


def test_regranularize_finer_with_partial_last_block():
    sf = torch.tensor([[1.0, 2.0]])  # K = 200: blocks of 128 -> 7 blocks of 32
    assert regranularize_k(sf, 200, 128, 32).tolist() == [[1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0]]


def test_regranularize_coarser_when_groups_identical():
    sf = torch.tensor([[1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0]])
    assert regranularize_k(sf, 200, 32, 128).tolist() == [[1.0, 2.0]]


def test_regranularize_coarser_refuses_unequal_groups():
    sf = torch.tensor([[1.0, 1.0, 1.0, 2.0]])
    with pytest.raises(LayoutConversionError, match="differ"):
        regranularize_k(sf, 128, 32, 128)


def test_regranularize_refuses_non_dividing_granularities():
    with pytest.raises(LayoutConversionError, match="divide"):
        regranularize_k(torch.ones(2, 4), 512, 128, 96)


def test_regranularize_refuses_wrong_block_count():
    with pytest.raises(LayoutConversionError, match="K-blocks"):
        regranularize_k(torch.ones(2, 3), 512, 128, 32)


def test_regranularize_works_on_uint8_exponents():
    e = torch.tensor([[0x7F, 0x80]], dtype=torch.uint8)
    assert regranularize_k(e, 256, 128, 64).tolist() == [[0x7F, 0x7F, 0x80, 0x80]]


@FAST
@given(g=groups, mn=st.integers(1, 9), k=st.integers(1, 1100), seed=seeds)
def test_regranularize_refine_then_coarsen_round_trips(g, mn, k, seed):
    sf = random_scales(_shape(g, mn, (k + 127) // 128), seed)
    fine = regranularize_k(sf, k, 128, 32)
    assert fine.shape[-1] == (k + 31) // 32
    idx = torch.arange(fine.shape[-1]) // 4
    assert same_bits(fine, sf[..., idx])
    assert same_bits(regranularize_k(fine, k, 32, 128), sf)


# --- Ascend MX -------------------------------------------------------------------------------


def test_ascend_odd_trailing_block_pairs_with_zero():
    # MN = 2, three blocks of 32 (K = 96) -> 2 words per row; word (p, m) at p*MN + m
    sf = torch.tensor([[1.0, 2.0, 4.0], [0.5, 0.25, 8.0]])  # 7f 80 81 / 7e 7d 82
    out = ascend_mx_encode(sf)
    assert out.shape == (2, 2) and out.stride() == (1, 2)
    assert storage_bytes(out) == [0x7F, 0x80, 0x7E, 0x7D, 0x81, 0x00, 0x82, 0x00]


def test_ascend_grouped_stride_is_mn_times_words_without_padding():
    out = ascend_mx_encode(random_pow2_scales((3, 5, 7)))
    assert out.shape == (3, 5, 4) and out.stride() == (20, 1, 5)
    assert out.untyped_storage().nbytes() == 3 * 5 * 4 * 2


@FAST
@given(g=groups, mn=mn_sizes, kb=k_blocks, seed=seeds)
def test_ascend_round_trip_and_layout(g, mn, kb, seed):
    sf = random_pow2_scales(_shape(g, mn, kb), seed)
    out = ascend_mx_encode(sf)
    assert out.shape[-2:] == (mn, (kb + 1) // 2) and is_ascend_mx_layout(out)
    assert same_bits(ascend_mx_decode(out, kb), sf)
    view = ascend_mx_byte_view(out)
    assert view.shape[-3:] == ((kb + 1) // 2, mn, 2) and view.data_ptr() == out.data_ptr()
    if kb % 2:  # the odd trailing block sits in the low byte of the last word, paired with 0
        last = view.view(torch.uint8)[..., kb // 2, :, :]
        assert torch.equal(last[..., 0], (sf[..., kb - 1].view(torch.int32) >> 23).to(torch.uint8))
        assert not last[..., 1].any()
    assert same_bits(ascend_mx_kmajor_decode(ascend_mx_kmajor_encode(sf), kb), sf)


def test_ascend_byte_view_element_p_m_j_is_block_2p_plus_j_of_row_m():
    sf = random_pow2_scales((2, 6, 9))
    e = (sf.view(torch.int32) >> 23).to(torch.uint8)
    view = ascend_mx_byte_view(ascend_mx_encode(sf)).view(torch.uint8)  # [2, 5, 6, 2]
    padded = torch.nn.functional.pad(e, (0, 1))  # [2, 6, 10]
    assert torch.equal(view, padded.view(2, 6, 5, 2).permute(0, 2, 1, 3))


def test_ascend_byte_view_shares_storage():
    packed = ascend_mx_encode(random_pow2_scales((4, 4)))
    view = ascend_mx_byte_view(packed)
    view.view(torch.uint8)[0, 0, 0] = 0x11
    assert int(packed[0, 0]) & 0xFF == 0x11


def test_ascend_byte_view_refuses_other_strides():
    packed = ascend_mx_encode(random_pow2_scales((4, 6))).contiguous()
    with pytest.raises(LayoutConversionError, match="ascend_mx_encode"):
        ascend_mx_byte_view(packed)


def test_ascend_refuses_non_power_of_two_scales():
    with pytest.raises(LayoutConversionError, match="powers of two"):
        ascend_mx_encode(random_scales((4, 4)))


@FAST
@given(
    g=groups,
    mn=st.integers(1, 300),
    block_mn=st.sampled_from([1, 3, 128]),
    k=st.integers(1, 1100),
    block_k=st.sampled_from([32, 64, 128]),
    seed=seeds,
)
def test_ascend_from_blocks_equals_broadcast_refine_then_encode(g, mn, block_mn, k, block_k, seed):
    blocks = random_pow2_scales(_shape(g, (mn + block_mn - 1) // block_mn, (k + block_k - 1) // block_k), seed)
    fused = ascend_mx_encode_from_blocks(blocks, mn, k, block_mn, block_k)
    rows = broadcast_block_scales_to_rows(blocks, mn, block_mn)
    plain = ascend_mx_encode(regranularize_k(rows, k, block_k, 32))
    assert fused.stride() == plain.stride() and storage_bytes(fused) == storage_bytes(plain)


def test_ascend_large_weight_scales_from_blocks():
    # 32 experts of a 2048 x 7168 weight: [32, 16, 56] -> int16 [32, 2048, 112]
    blocks = random_pow2_scales((32, 16, 56))
    packed = ascend_mx_encode_from_blocks(blocks, 2048, 7168)
    assert packed.shape == (32, 2048, 112) and is_ascend_mx_layout(packed)
    assert same_bits(ascend_mx_decode(packed[31], 224)[2047, ::4], blocks[31, 15])


def test_ascend_large_activation_scales_encode_quickly():
    # 7168 rows, K = 7168: (1,128) scales [7168, 56] -> (1,32) [7168, 224] -> int16 [7168, 112]
    sf = random_pow2_scales((7168, 56))
    start = time.perf_counter()
    packed = ascend_mx_encode(regranularize_k(sf, 7168, 128, 32))
    elapsed = time.perf_counter() - start
    assert packed.shape == (7168, 112) and is_ascend_mx_layout(packed)
    assert same_bits(regranularize_k(ascend_mx_decode(packed, 224), 7168, 32, 128), sf)
    assert elapsed < 2.0
