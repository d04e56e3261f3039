"""Known answers for the byte forms CANN's operators document (docs/ascend.md): MX scales as K-major
pairs, the FRACTAL_NZ weight tiles of aclnnQuantMatmulV5, and the 656-byte KV row in CANN's order.

Expected bytes are written out by hand from the documentation's shape tables, not computed by the
code under test.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layouts_gen import generator, random_pow2_scales, same_bits, seeds
from portable_kernels.layouts import (
    LayoutConversionError,
    ascend_kv_to_flashmla,
    ascend_mx_byte_view,
    ascend_mx_encode,
    ascend_mx_kmajor_decode,
    ascend_mx_kmajor_encode,
    ascend_mx_kmajor_encode_from_blocks,
    broadcast_block_scales_to_rows,
    flashmla_kv_to_ascend,
    nd_to_nz,
    pack_fp8_kv_cache,
    regranularize_k,
)

FAST = settings(max_examples=25, deadline=None, derandomize=True)


def _pow2(exponents):
    """fp32 scales 2^(e - 127) from exponent bytes."""
    return (torch.tensor(exponents, dtype=torch.int32) << 23).view(torch.float32)


# ---------------------------------------------------------------------------------------------
# MX scales: CANN's (m, ceil(k/64), 2) and (n, ceil(k/64), 2) for K-major data


def test_x1_scale_shape_is_m_by_k64_by_2():
    # aclnnQuantMatmulV5 MX: x1 (m, k) not transposed -> x1Scale (m, ceil(k/64), 2); m = 5, k = 200
    sf32 = _pow2([[127] * 7] * 5)  # ceil(200/32) = 7 blocks
    out = ascend_mx_kmajor_encode(sf32)
    assert out.dtype == torch.float8_e8m0fnu and out.shape == (5, 4, 2) and out.is_contiguous()


def test_x2_scale_of_an_n_by_k_weight_is_n_by_k64_by_2():
    # x2 stored (n, k) = transposed -> x2Scale stored (n, ceil(k/64), 2); n = 7, k = 128
    sf = _pow2([[127, 128]] * 1)  # one (128, 64) block row, two K blocks of 64
    out = ascend_mx_kmajor_encode_from_blocks(sf, 7, 128, block_mn=128, block_k=64)
    assert out.shape == (7, 2, 2)
    assert out.view(torch.uint8).tolist() == [[[127, 127], [128, 128]]] * 7


def test_kmajor_odd_trailing_block_pairs_with_zero_byte():
    # K = 96: three blocks of 32 with exponents a b c -> bytes a b | c 00
    out = ascend_mx_kmajor_encode(_pow2([[0x70, 0x80, 0x90]]))
    assert out.view(torch.uint8).flatten().tolist() == [0x70, 0x80, 0x90, 0x00]


def test_kmajor_from_blocks_known_bytes():
    # weight N = 3, K = 128, block scales per (2, 64) with exponents [[a, b], [c, d]]:
    # rows 0 and 1 take block row 0 -> a a b b; row 2 takes block row 1 -> c c d d
    a, b, c, d = 0x81, 0x7F, 0x79, 0x85
    out = ascend_mx_kmajor_encode_from_blocks(_pow2([[a, b], [c, d]]), 3, 128, block_mn=2, block_k=64)
    assert out.view(torch.uint8).flatten().tolist() == [a, a, b, b, a, a, b, b, c, c, d, d]


def test_kmajor_from_activation_blocks_repeats_each_128_scale_four_times():
    # (1, 128) activation scales, M = 2, K = 256: each exponent covers four blocks of 32 = two pairs
    out = ascend_mx_kmajor_encode_from_blocks(_pow2([[0x7E, 0x82], [0x01, 0xFE]]), 2, 256, block_mn=1)
    assert out.view(torch.uint8).flatten().tolist() == [0x7E] * 4 + [0x82] * 4 + [0x01] * 4 + [0xFE] * 4


@FAST
@given(g=st.one_of(st.none(), st.integers(1, 3)), mn=st.integers(1, 40), block_mn=st.sampled_from([1, 4, 128]),
       k=st.integers(1, 700), block_k=st.sampled_from([32, 64, 128]), seed=seeds)
def test_kmajor_from_blocks_equals_broadcast_refine_then_encode(g, mn, block_mn, k, block_k, seed):
    rows = -(-mn // block_mn)
    sf = random_pow2_scales(((g,) if g else ()) + (rows, -(-k // block_k)), seed)
    per_row = broadcast_block_scales_to_rows(sf, mn, block_mn)
    expected = ascend_mx_kmajor_encode(regranularize_k(per_row, k, block_k, 32))
    assert same_bits(ascend_mx_kmajor_encode_from_blocks(sf, mn, k, block_mn, block_k), expected)


@FAST
@given(mn=st.integers(1, 40), kb=st.integers(1, 13), seed=seeds)
def test_kmajor_pairs_are_the_mn_major_pairs_transposed(mn, kb, seed):
    # the two forms hold the same pairs: [MN, P, 2] (K-major data) vs [P, MN, 2] (MN-major data)
    sf32 = random_pow2_scales((mn, kb), seed)
    kmajor = ascend_mx_kmajor_encode(sf32).view(torch.uint8)
    mn_major = ascend_mx_byte_view(ascend_mx_encode(sf32)).view(torch.uint8)
    assert torch.equal(kmajor, mn_major.transpose(0, 1))
    assert same_bits(ascend_mx_kmajor_decode(ascend_mx_kmajor_encode(sf32), kb), sf32)


def test_kmajor_from_blocks_refuses_non_power_of_two():
    with pytest.raises(LayoutConversionError, match="UE8M0"):
        ascend_mx_kmajor_encode_from_blocks(torch.tensor([[1.5]]), 4, 128)


# ---------------------------------------------------------------------------------------------
# FRACTAL_NZ: aclnnQuantMatmulV5 "NZ, transposeX2 true: (k1, n1, n0, k0), k0 = 32, n0 = 16, k1 = ceil(k/32)"


def test_nz_matches_cann_x2_nz_dims():
    n, k = 17, 40
    w = torch.arange(n * k, dtype=torch.int32).remainder(251).add(1).to(torch.uint8).view(n, k)  # no zeros
    nz = nd_to_nz(w)
    assert nz.shape == (2, 2, 16, 32)  # (ceil(40/32), ceil(17/16), 16, 32)
    for row, col in [(0, 0), (0, 31), (0, 32), (15, 39), (16, 0), (16, 33)]:
        assert nz[col // 32, row // 16, row % 16, col % 32] == w[row, col]
    assert int(nz[1, :, :, 8:].abs().sum()) == 0  # K padded from 40 to 64 with zeros
    assert int(nz[:, 1, 1:, :].abs().sum()) == 0  # N padded from 17 to 32 with zeros


# ---------------------------------------------------------------------------------------------
# 656-byte KV row: FlashMLA [nope | scales | rope] <-> CANN [nope | rope | scales]


def _flashmla_token():
    latent = torch.zeros(512)
    latent[0:4] = torch.tensor([448.0, 1.0, -2.0, 0.5])  # tile 0 scale 1.0
    latent[256] = 500.0  # tile 2 scale 2.0
    rope = torch.zeros(64, dtype=torch.bfloat16)
    rope[0:3] = torch.tensor([1.0, -2.0, 0.5])
    return pack_fp8_kv_cache(latent, rope)


def test_flashmla_to_ascend_known_bytes():
    b = flashmla_kv_to_ascend(_flashmla_token()).tolist()
    assert len(b) == 656
    assert b[0:4] == [0x7E, 0x38, 0xC0, 0x30]  # e4m3 448, 1, -2, 0.5: nope stays at 0..511
    assert b[256] == 0x78  # 500 / 2 = 250 -> 256
    assert b[512:518] == [0x80, 0x3F, 0x00, 0xC0, 0x00, 0x3F]  # bf16 rope 1.0, -2.0, 0.5 at 512..
    assert b[518:640] == [0] * 122
    assert b[640:656] == [0x00, 0x00, 0x80, 0x3F,  # scale tile 0: 1.0
                          0x00, 0x00, 0x80, 0x34,  # tile 1 all zero: 2^-22
                          0x00, 0x00, 0x00, 0x40,  # tile 2: 2.0
                          0x00, 0x00, 0x80, 0x34]  # tile 3 all zero: 2^-22   fmt: skip


def test_ascend_to_flashmla_inverts_known_token():
    token = _flashmla_token()
    assert torch.equal(ascend_kv_to_flashmla(flashmla_kv_to_ascend(token)), token)


@FAST
@given(blocks=st.integers(1, 3), block_size=st.sampled_from([1, 16, 64]), seed=seeds)
def test_repack_round_trip_keeps_paged_shape(blocks, block_size, seed):
    g = generator(seed)
    cache = torch.randint(0, 256, (blocks, block_size, 1, 656), generator=g, dtype=torch.int32).to(torch.uint8)
    ascend = flashmla_kv_to_ascend(cache)
    assert ascend.shape == cache.shape and ascend.dtype == torch.uint8
    assert torch.equal(ascend[..., 512:640], cache[..., 528:656])
    assert torch.equal(ascend[..., 640:656], cache[..., 512:528])
    assert torch.equal(ascend_kv_to_flashmla(ascend), cache)


def test_repack_refuses_other_row_sizes():
    with pytest.raises(LayoutConversionError, match="656"):
        flashmla_kv_to_ascend(torch.zeros(2, 576, dtype=torch.uint8))
