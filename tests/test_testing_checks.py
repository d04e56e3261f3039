"""The conformance checkers fail when they should (a checker that cannot fail proves nothing)."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.quantization import dequantize_reference
from portable_kernels.testing.checks import SCALE_RTOL, assert_quantization_matches
from portable_kernels.testing.core import CaseFailure
from portable_kernels.testing.generators import randn


def _check(q, ref, exact=False):
    assert_quantization_matches(q.scale, dequantize_reference(q), q.data.view(torch.uint8), ref.scale,
                                dequantize_reference(ref), ref.data.view(torch.uint8), exact_scales=exact)


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


def test_many_changed_codes_fail():
    ref = _ref()
    flipped = ref.data.view(torch.uint8).clone()
    flipped[:, ::7] ^= 1
    bad = pk.QuantTensor(flipped.view(torch.float8_e4m3fn), ref.scale, ref.granularity)
    with pytest.raises(CaseFailure, match="quantized bytes differ"):
        _check(bad, ref)
