"""Ascend FRACTAL_NZ: tile shape per dtype, known answer, FP8 weight view, round trips."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layouts_gen import generator, seeds
from portable_kernels.layouts import LayoutConversionError, nd_to_nz, nz_c0, nz_shape, nz_to_nd

FAST = settings(max_examples=40, deadline=None, derandomize=True)
DTYPES = [torch.float8_e4m3fn, torch.int8, torch.uint8, torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize(
    "dtype, c0",
    [(torch.float8_e4m3fn, 32), (torch.int8, 32), (torch.uint8, 32), (torch.bfloat16, 16), (torch.float16, 16),
     (torch.float32, 8)],
)  # fmt: skip
def test_c0_is_32_bytes_over_itemsize(dtype, c0):
    assert nz_c0(dtype) == c0


def test_nz_shape_pads_m_to_16_and_n_to_c0():
    assert nz_shape(17, 33, torch.bfloat16) == (3, 2, 16, 16)


def test_nz_refuses_eight_byte_elements():
    with pytest.raises(LayoutConversionError, match="1-, 2- or 4-byte"):
        nd_to_nz(torch.zeros(2, 2, dtype=torch.float64))


def test_nz_known_answer_int32_two_by_ten():
    x = torch.arange(20, dtype=torch.int32).view(2, 10)  # C0 = 8 for 4-byte elements
    zero_row = [0] * 8
    expected = [
        [[[0, 1, 2, 3, 4, 5, 6, 7], [10, 11, 12, 13, 14, 15, 16, 17]] + [zero_row] * 14],
        [[[8, 9, 0, 0, 0, 0, 0, 0], [18, 19, 0, 0, 0, 0, 0, 0]] + [zero_row] * 14],
    ]
    assert nd_to_nz(x).tolist() == expected


def test_fp8_weight_n_by_k_in_nz_is_k_over_32_by_n_by_32_bytes():
    n, k = 48, 96
    w = torch.randint(0, 256, (n, k), generator=generator(), dtype=torch.uint8).view(torch.float8_e4m3fn)
    nz = nd_to_nz(w).view(torch.uint8).reshape(k // 32, n, 32)
    for kb in range(k // 32):  # three tiles: a handful of dims, not elements
        assert torch.equal(nz[kb], w.view(torch.uint8)[:, kb * 32 : (kb + 1) * 32])


def _reference_nz(x: torch.Tensor) -> torch.Tensor:
    *lead, m, n = x.shape
    n1, m1, _, c0 = nz_shape(m, n, x.dtype)
    bits = x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()])
    padded = torch.zeros((*lead, m1 * 16, n1 * c0), dtype=bits.dtype)
    padded[..., :m, :n] = bits
    return padded.unflatten(-1, (n1, c0)).unflatten(-3, (m1, 16)).movedim(-2, -4).contiguous()


@FAST
@given(
    lead=st.lists(st.integers(1, 3), max_size=2),
    m=st.integers(1, 40),
    n=st.integers(1, 70),
    dtype=st.sampled_from(DTYPES),
    seed=seeds,
)
def test_nd_to_nz_matches_reference_and_round_trips(lead, m, n, dtype, seed):
    raw = torch.randint(1, 100, (*lead, m, n), generator=generator(seed), dtype=torch.uint8)
    x = raw.to(torch.float32).to(dtype) if dtype.is_floating_point else raw.to(dtype)
    nz = nd_to_nz(x)
    assert nz.dtype == dtype and nz.is_contiguous() and nz.shape == (*lead, *nz_shape(m, n, dtype))
    assert torch.equal(nz.view(_reference_nz(x).dtype), _reference_nz(x))
    back = nz_to_nd(nz, m, n)
    assert back.is_contiguous() and torch.equal(back.view(torch.uint8), x.contiguous().view(torch.uint8))


def test_nd_to_nz_accepts_transposed_input():
    x = torch.randn(40, 24, generator=generator()).to(torch.bfloat16).t()
    assert torch.equal(nz_to_nd(nd_to_nz(x), 24, 40), x)


def test_nz_to_nd_refuses_shape_mismatch():
    nz = nd_to_nz(torch.zeros(20, 40, dtype=torch.bfloat16))
    with pytest.raises(LayoutConversionError, match="need"):
        nz_to_nd(nz, 20, 50)


def test_nd_to_nz_refuses_vectors():
    with pytest.raises(LayoutConversionError, match="at least 2 dims"):
        nd_to_nz(torch.zeros(8))


def test_nd_to_nz_large_fp8_weight_is_fast():
    import time

    w = torch.randint(0, 256, (7168, 2048), generator=generator(), dtype=torch.uint8).view(torch.float8_e4m3fn)
    start = time.perf_counter()
    nz = nd_to_nz(w)
    elapsed = time.perf_counter() - start
    assert nz.shape == (64, 448, 16, 32)
    assert torch.equal(nz.view(torch.uint8)[5].reshape(7168, 32), w.view(torch.uint8)[:, 160:192])
    assert elapsed < 2.0
