"""Every defined Format round-trips any operand its rule admits, empty and odd shapes included:
encode -> a validated PreparedTensor (the Format's own shape check) -> decode gives the same numbers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layouts_gen import generator, random_pow2_scales

import portable_kernels as pk
from portable_kernels.core.formats import decode_operand, known_formats
from portable_kernels.layouts import LayoutConversionError
from portable_kernels.ops.quant.fp8 import dequantized
from portable_kernels.core.tensors import QuantTensor

#: Formats whose encode may refuse an operand by design (values not exact in their storage dtype)
MAY_REFUSE = {"ascend-dequantized-bf16", "ascend-dequantized-bf16+npu-nz"}


def _fp8_codes(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    codes = torch.randint(0, 256, shape, generator=generator(seed), dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x38  # e4m3 NaN codes -> 1.0
    return codes.view(torch.float8_e4m3fn)


def _operand(lead: tuple[int, ...], mn: int, k: int, granularity: tuple[int, int], element: str,
             seed: int) -> QuantTensor:
    if element == "e2m1":
        data = torch.randint(0, 256, (*lead, mn, k // 2), generator=generator(seed), dtype=torch.uint8)
    else:
        data = _fp8_codes((*lead, mn, k), seed)
    gm, gk = granularity
    scale = random_pow2_scales((*lead, -(-mn // gm), -(-k // gk)), seed=seed + 1)
    scale = torch.where(scale > 2.0 ** 40, scale * 2.0 ** -60, scale)  # keep values finite after scaling
    return QuantTensor(data, scale, granularity, ue8m0=True, element=element)


shapes = st.tuples(st.sampled_from([(), (1,), (3,)]), st.integers(0, 260), st.sampled_from([0, 2, 30, 64, 130, 300]))
granularities = st.sampled_from([(1, 128), (128, 128), (1, 32)])


@pytest.mark.parametrize("name", sorted(known_formats()))
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, granularity=granularities, element=st.sampled_from(["e4m3", "e2m1"]), seed=st.integers(0, 99))
def test_format_round_trips(name, shape, granularity, element, seed):
    fmt = known_formats()[name]
    lead, mn, k = shape
    if element not in fmt.elements:
        return
    qt = _operand(lead, mn, k, granularity, element, seed)
    try:
        data, scale, storage = fmt.encode(qt)
    except LayoutConversionError:
        assert name in MAY_REFUSE
        return
    prepared = pk.PreparedTensor(data, scale, fmt, "roundtrip", tuple(qt.shape), granularity, tuple(storage), True,
                                 element)  # the constructor runs the Format's own shape check
    assert torch.equal(dequantized(decode_operand(prepared)), pk.dequantize(qt))
