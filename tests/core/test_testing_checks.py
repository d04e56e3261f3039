"""The conformance checkers fail when they should (a checker that cannot fail proves nothing)."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.testing.checks import SCALE_RTOL, assert_quantization_matches
from portable_kernels.testing.core import CaseFailure
from portable_kernels.testing.generators import randn


def _check(q, ref, exact=False):
    assert_quantization_matches(q, ref, exact_scales=exact)


def _ref():
    return pk.per_token_cast_to_fp8(randn(64, 1024, seed=1))


def test_identical_quantization_passes():
    _check(_ref(), _ref(), exact=True)


def test_one_ulp_scale_difference_passes_for_fp32_scales_only():
    ref = _ref()
    nudged = pk.QuantTensor(ref.data, torch.nextafter(ref.scale, torch.tensor(float("inf"))), ref.granularity)
    _check(nudged, ref)
    with pytest.raises(CaseFailure, match="power-of-two scales differ"):
        _check(nudged, ref, exact=True)


def test_scale_off_by_more_than_the_tolerance_fails():
    ref = _ref()
    off = pk.QuantTensor(ref.data, ref.scale * (1 + 8 * SCALE_RTOL), ref.granularity)
    with pytest.raises(CaseFailure, match="scales differ"):
        _check(off, ref)


def _with_codes(ref, codes):
    return pk.QuantTensor(codes.view(torch.float8_e4m3fn), ref.scale, ref.granularity)


def test_a_few_one_step_rounding_flips_pass():
    ref = _ref()
    codes = ref.data.view(torch.uint8).clone()
    codes[0, :20] += torch.where(codes[0, :20] & 0x7F < 0x7E, 1, -1).to(torch.uint8)
    _check(_with_codes(ref, codes), ref)


def test_systematic_one_step_flips_fail():
    ref = _ref()
    codes = ref.data.view(torch.uint8).clone()
    codes[:, ::7] ^= 1
    with pytest.raises(CaseFailure, match="by one step"):
        _check(_with_codes(ref, codes), ref)


def test_a_code_two_steps_away_fails():
    ref = _ref()
    codes = ref.data.view(torch.uint8).clone()
    codes[3, 5] = (codes[3, 5] & 0x80) | ((codes[3, 5] & 0x7F) + 2 if codes[3, 5] & 0x7F < 0x70 else 0)
    with pytest.raises(CaseFailure, match="more than one step"):
        _check(_with_codes(ref, codes), ref)


def test_fp4_codes_are_compared_by_magnitude_rank():
    x = randn(16, 256, seed=3)
    q = pk.per_token_cast_to_fp4(x)
    _check(q, q, exact=True)
