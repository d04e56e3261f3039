"""Native layout encoders (portable_kernels/core/native/layout_encoders.*): the same tensors as the torch
encoders in portable_kernels.layouts (dtype, shape, strides, every byte), the same errors, and
prepare_inputs using them for the formats they cover."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.layouts import fp8_scales as ref
from portable_kernels.layouts import nz as ref_nz
from portable_kernels.layouts.errors import LayoutConversionError
from portable_kernels.core.native import layout_encoders as enc

pytestmark = pytest.mark.skipif(enc.LIB.get() is None, reason=f"native encoders unavailable: {enc.LIB.reason()}")


def _pow2(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(100, 140, shape, generator=g, dtype=torch.int32) << 23).view(torch.float32)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    # the storage too: pad slots included (a TMA load of the last column may read them)
    assert got.untyped_storage().nbytes() == want.untyped_storage().nbytes()
    as_bytes = (lambda t: t.view(torch.uint8)) if got.dtype == torch.float8_e8m0fnu else (lambda t: t)
    assert torch.equal(as_bytes(got), as_bytes(want))


@pytest.mark.parametrize("mn", [1, 3, 130, 4096])
@pytest.mark.parametrize("kb", [1, 3, 5, 56])
@pytest.mark.parametrize("lead", [(), (3,)])
def test_scale_encoders_match_the_torch_ones(mn, kb, lead):
    s = _pow2(*lead, mn, kb, seed=mn + kb)
    _same(enc.sm90_sfa_encode(s), ref.sm90_sfa_encode(s))
    _same(enc.sm100_ue8m0_encode_from_blocks(s, mn, 1), ref.sm100_ue8m0_encode_from_blocks(s, mn, 1))
    for block in (128, 7):
        sb = _pow2(*lead, -(-mn // block), kb, seed=block)
        _same(enc.sm100_ue8m0_encode_from_blocks(sb, mn, block), ref.sm100_ue8m0_encode_from_blocks(sb, mn, block))
        for k in {kb * 128, kb * 128 - 100}:
            if -(-k // 128) != kb:
                continue
            _same(enc.ascend_mx_encode_from_blocks(sb, mn, k, block, 128),
                  ref.ascend_mx_encode_from_blocks(sb, mn, k, block, 128))
            _same(enc.ascend_mx_kmajor_encode_from_blocks(sb, mn, k, block, 128),
                  ref.ascend_mx_kmajor_encode_from_blocks(sb, mn, k, block, 128))


@pytest.mark.parametrize("shape", [(7, 40), (16, 32), (33, 100), (2, 3, 17, 64), (1, 1)])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float32, torch.uint8])
def test_nz_matches_the_torch_encoder(shape, dtype):
    x = torch.randn(*shape).to(dtype) if dtype != torch.uint8 else torch.randint(0, 255, shape, dtype=dtype)
    _same(enc.nd_to_nz(x), ref_nz.nd_to_nz(x))


def test_non_power_of_two_scales_raise_the_torch_error():
    with pytest.raises(LayoutConversionError, match="not powers of two"):
        enc.sm100_ue8m0_encode_from_blocks(torch.tensor([[1.5, 2.0]]), 1, 1)
    with pytest.raises(LayoutConversionError, match="not powers of two"):
        enc.ascend_mx_encode_from_blocks(torch.tensor([[0.0]]), 1, 32, 1, 32)


def test_inputs_outside_the_native_path_go_to_the_torch_encoders():
    strided = _pow2(8, 6).T  # not contiguous
    _same(enc.sm90_sfa_encode(strided), ref.sm90_sfa_encode(strided))
    empty = torch.empty(0, 4)
    _same(enc.sm100_ue8m0_encode_from_blocks(empty, 0, 1), ref.sm100_ue8m0_encode_from_blocks(empty, 0, 1))
    x = torch.randn(20, 64).to(torch.float8_e4m3fn)[:, :32]
    _same(enc.nd_to_nz(x), ref_nz.nd_to_nz(x))


@pytest.mark.parametrize("backend,options", [("nvidia", {"arch": "sm90"}), ("nvidia", {"arch": "sm100"}),
                                             ("ascend", {})])
def test_prepare_inputs_encodes_natively_with_the_same_bytes(backend, options):
    a = pk.per_token_cast_to_fp8(torch.randn(5, 512), use_ue8m0=True)
    b = pk.per_block_cast_to_fp8(torch.randn(130, 512), use_ue8m0=True)
    with pk.use_backend(backend, **options):
        prepared = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
    for qt, p in ((a, prepared["a"]), (b, prepared["b"])):
        assert enc.accelerated_encode(p.format, qt) is not None
        data, scale, _ = p.format.encode(qt)  # the Format's own (torch) encode
        assert torch.equal(p.data.view(torch.uint8), data.view(torch.uint8))
        _same(p.scale, scale)


def test_accelerated_encode_declines_formats_it_does_not_cover():
    a = pk.per_token_cast_to_fp8(torch.randn(2, 128))
    assert enc.accelerated_encode(pk.PLAIN, a) is None
