"""The cpu backend's native per_block_cast_lossless (kernels/quant_extra.cpp) against the
contract's reference, bit for bit, and its refusals (the reference's errors)."""

import pytest
import torch

from portable_kernels.backends.cpu.providers.quant_extra import LIB, lossless_cast
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.core.errors import ContractError
from portable_kernels.ops.quant.lossless import lossless_cast_reference, per_block_cast_lossless
from portable_kernels.testing.lossless_cases import edge_fp4_input, fp4_input

pytestmark = pytest.mark.skipif(LIB.get() is None, reason=f"native build unavailable: {LIB.reason()}")

SHAPES = [(70, 256, (1, 32), (32, 32)), (130, 512, (1, 32), (128, 128)), (5, 96, (1, 32), (1, 64)),
          (33, 70, (1, 5), (3, 35)), (257, 2048, (32, 32), (128, 128)), (1024, 7168, (1, 32), (128, 128)),
          (3, 66, (3, 3), (3, 33))]


def _same(got, want):
    assert got[0].dtype == torch.float8_e4m3fn and torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert got[1].dtype == torch.float32 and torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("m", "k", "ib", "ob"), SHAPES)
def test_native_recast_equals_the_reference(m, k, ib, ob, threads):
    data, sf = fp4_input(m, k, ib, seed=m * 7 + k, spread=8.0)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with trace_providers() as ran:
            got = per_block_cast_lossless(data.view(torch.int8), sf, ib, ob)
    finally:
        torch.set_num_threads(before)
    assert ran == [("per_block_cast_lossless", "cpu", "native")]
    _same(got, lossless_cast_reference(data, sf, ib, ob))


@pytest.mark.parametrize("ob", [(32, 64), (1, 64), (2, 32), (64, 64)])
def test_native_edge_codes_and_scales(ob):
    data, sf = edge_fp4_input()
    if ob == (64, 64):  # rows 0-31 and 32-63 share a block: 2^0 vs 2^-120 is refused like the reference
        with pytest.raises(ContractError, match="'sf'") as native:
            lossless_cast(data, sf, (1, 32), ob)
        with pytest.raises(ContractError) as reference:
            lossless_cast_reference(data, sf, (1, 32), ob)
        assert str(native.value) == str(reference.value)
        return
    _same(lossless_cast(data, sf, (1, 32), ob), lossless_cast_reference(data, sf, (1, 32), ob))


@pytest.mark.parametrize("change", ["not_pow2", "negative", "zero", "nan", "span", "underflow"])
def test_native_refusals_are_the_reference_errors(change):
    data, sf = fp4_input(16, 128, (1, 32), seed=11)
    sf = sf.clone()
    if change == "not_pow2":
        sf[9, 2] *= 1.25
    elif change == "negative":
        sf[9, 2] = -sf[9, 2]
    elif change == "zero":
        sf[9, 2] = 0.0
    elif change == "nan":
        sf[9, 2] = float("nan")
    elif change == "span":
        sf[9, 2] = sf.max() * 2.0 ** 12
    else:
        sf.fill_(2.0 ** -122)
    with pytest.raises(ContractError, match="'sf'") as native:
        lossless_cast(data, sf, (1, 32), (16, 128))
    with pytest.raises(ContractError) as reference:
        lossless_cast_reference(data, sf, (1, 32), (16, 128))
    assert str(native.value) == str(reference.value)


def test_native_validates_before_launch():
    data, sf = fp4_input(4, 64, (1, 32), seed=12)
    with pytest.raises(ContractError, match="'sf'"):
        lossless_cast(data, sf[:, :1], (1, 32), (1, 64))
    with pytest.raises(ContractError, match="'data'"):
        lossless_cast(data.float(), sf, (1, 32), (1, 64))
    with pytest.raises(ContractError, match="'out_block_size'"):
        lossless_cast(data, sf, (1, 32), (1, 48))
