"""FORMATS.md worked example, M = 3, K = 512: the exact bytes on SM90, SM100 and Ascend.

Every expected byte below is written out by hand from the scales, not computed by the code
under test.
"""

import torch

from layouts_gen import storage_bytes
from portable_kernels.layouts import (
    ascend_mx_byte_view,
    ascend_mx_encode,
    ascend_mx_kmajor_encode,
    regranularize_k,
    sm90_sfa_encode,
    sm100_ue8m0_encode,
)

K = 512

# Arbitrary fp32 scales for SM90 (fp32 carries any value): s[m][kb].
S_FP32 = torch.tensor(
    [
        [1.0, 1.5, 3.0, 0.75],  # 0x3f800000 0x3fc00000 0x40400000 0x3f400000
        [2.0, 0.5, 1.25, 5.0],  # 0x40000000 0x3f000000 0x3fa00000 0x40a00000
        [0.25, 6.0, 0.125, 7.0],  # 0x3e800000 0x40c00000 0x3e000000 0x40e00000
    ]
)

# Power-of-two scales for the UE8M0 formats, exponent bytes in the comments.
S_POW2 = torch.tensor(
    [
        [1.0, 2.0, 0.5, 4.0],  # 7f 80 7e 81
        [2.0**-7, 2.0**-6, 2.0**-5, 2.0**-4],  # 78 79 7a 7b
        [2.0**-126, 2.0**127, 2.0**-15, 2.0**17],  # 01 fe 70 90
    ]
)


def test_sm90_worked_example_is_64_bytes_column_per_k_block():
    # s00 s10 s20 pad | s01 s11 s21 pad | s02 s12 s22 pad | s03 s13 s23 pad, little-endian floats
    expected = [
        0x00, 0x00, 0x80, 0x3F,  0x00, 0x00, 0x00, 0x40,  0x00, 0x00, 0x80, 0x3E,  0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0xC0, 0x3F,  0x00, 0x00, 0x00, 0x3F,  0x00, 0x00, 0xC0, 0x40,  0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x40, 0x40,  0x00, 0x00, 0xA0, 0x3F,  0x00, 0x00, 0x00, 0x3E,  0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x40, 0x3F,  0x00, 0x00, 0xA0, 0x40,  0x00, 0x00, 0xE0, 0x40,  0x00, 0x00, 0x00, 0x00,
    ]  # fmt: skip
    out = sm90_sfa_encode(S_FP32)
    assert out.shape == (3, 4) and out.stride() == (1, 4)
    assert storage_bytes(out) == expected


def test_sm100_worked_example_is_16_bytes_one_word_per_row():
    # e00 e01 e02 e03 | e10 e11 e12 e13 | e20 e21 e22 e23 | pad pad pad pad
    expected = [
        0x7F, 0x80, 0x7E, 0x81,
        0x78, 0x79, 0x7A, 0x7B,
        0x01, 0xFE, 0x70, 0x90,
        0x00, 0x00, 0x00, 0x00,
    ]  # fmt: skip
    out = sm100_ue8m0_encode(S_POW2)
    assert out.dtype == torch.int32 and out.shape == (3, 1) and out.stride() == (1, 4)
    assert storage_bytes(out) == expected


def test_sm100_worked_example_words_follow_little_endian_formula():
    # w = e0 | e1 << 8 | e2 << 16 | e3 << 24, as signed int32
    expected = [[0x817E807F - 2**32], [0x7B7A7978], [0x9070FE01 - 2**32]]
    assert sm100_ue8m0_encode(S_POW2).tolist() == expected


# byte 2*(3p + m) + j = e32[m][2p + j] = e[m][(2p + j) // 4]
ASCEND_EXPECTED = [
    0x7F, 0x7F, 0x78, 0x78, 0x01, 0x01,  # p = 0: blocks 0, 1  (kb 0)
    0x7F, 0x7F, 0x78, 0x78, 0x01, 0x01,  # p = 1: blocks 2, 3  (kb 0)
    0x80, 0x80, 0x79, 0x79, 0xFE, 0xFE,  # p = 2: blocks 4, 5  (kb 1)
    0x80, 0x80, 0x79, 0x79, 0xFE, 0xFE,  # p = 3
    0x7E, 0x7E, 0x7A, 0x7A, 0x70, 0x70,  # p = 4: kb 2
    0x7E, 0x7E, 0x7A, 0x7A, 0x70, 0x70,  # p = 5
    0x81, 0x81, 0x7B, 0x7B, 0x90, 0x90,  # p = 6: kb 3
    0x81, 0x81, 0x7B, 0x7B, 0x90, 0x90,  # p = 7
]  # fmt: skip


def test_ascend_worked_example_is_48_bytes_mn_major_without_padding():
    out = ascend_mx_encode(regranularize_k(S_POW2, K, 128, 32))
    assert out.dtype == torch.int16 and out.shape == (3, 8) and out.stride() == (1, 3)
    assert storage_bytes(out) == ASCEND_EXPECTED


def test_ascend_worked_example_byte_view_is_k64_by_mn_by_2():
    view = ascend_mx_byte_view(ascend_mx_encode(regranularize_k(S_POW2, K, 128, 32)))
    assert view.dtype == torch.float8_e8m0fnu and view.shape == (8, 3, 2)
    assert view.view(torch.uint8).flatten().tolist() == ASCEND_EXPECTED


def test_ascend_worked_example_kmajor_bytes_are_mn_by_k64_by_2():
    out = ascend_mx_kmajor_encode(regranularize_k(S_POW2, K, 128, 32))
    assert out.shape == (3, 8, 2)
    expected = (
        [0x7F] * 4 + [0x80] * 4 + [0x7E] * 4 + [0x81] * 4
        + [0x78] * 4 + [0x79] * 4 + [0x7A] * 4 + [0x7B] * 4
        + [0x01] * 4 + [0xFE] * 4 + [0x70] * 4 + [0x90] * 4
    )  # fmt: skip
    assert out.view(torch.uint8).flatten().tolist() == expected


def test_regranularize_128_to_32_worked_example_repeats_each_scale_four_times():
    e32 = regranularize_k(S_POW2, K, 128, 32)
    assert e32.shape == (3, 16)
    assert e32[0].tolist() == [1.0] * 4 + [2.0] * 4 + [0.5] * 4 + [4.0] * 4
