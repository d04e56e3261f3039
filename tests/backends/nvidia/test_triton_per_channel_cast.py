"""The Triton per_channel_cast_to_fp8 kernel in Triton's interpreter: codes and scales byte for byte
equal to the contract's torch reference (both conventions, partial blocks, groups, every input
dtype), arguments refused before launch naming the argument, and the session's quick conformance
served by Triton for every case on sm90 and sm100."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from portable_kernels.backends.nvidia.kernels import cast_fp8_channel  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.ops.quant.fp8 import quantize_blocks_reference  # noqa: E402
from portable_kernels.testing.generators import randn  # noqa: E402

OP = "per_channel_cast_to_fp8"
CASES = [((128, 300), 128, torch.bfloat16), ((130, 7), 128, torch.bfloat16), ((2, 70, 200), 32, torch.float16),
         ((5, 9), 3, torch.float32), ((1, 1), 1, torch.bfloat16)]


@pytest.mark.parametrize("convention", ["portable", "deep_gemm"])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("shape,gran_k,dtype", CASES, ids=str)
def test_codes_and_scales_equal_the_reference_bytes(shape, gran_k, dtype, ue8m0, convention):
    x = randn(*shape, seed=sum(shape) + gran_k, dtype=dtype, scale=3.0)
    x.view(-1)[::13] = 0.0
    q, sf = cast_fp8_channel.per_channel_cast_to_fp8(x, gran_k, ue8m0, multiply_by_inverse=convention == "deep_gemm")
    want_q, want_sf = quantize_blocks_reference(x, gran_k, 1, ue8m0, convention)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert sf.is_contiguous() and torch.equal(sf.view(torch.int32), want_sf.view(torch.int32))


def test_a_nan_column_block_gets_a_nan_scale_and_keeps_the_others():
    """NaN's sign bit is not part of the contract (x86 and GPUs make different NaNs): the NaN block's
    codes are NaN codes, every other byte equals the reference's."""
    x = randn(256, 40, seed=3, dtype=torch.bfloat16)
    x[130, 5] = float("nan")
    q, sf = cast_fp8_channel.per_channel_cast_to_fp8(x, 128, False)
    want_q, want_sf = quantize_blocks_reference(x, 128, 1, False)
    assert torch.isnan(sf[1, 5]) and int(torch.isnan(sf).sum()) == 1
    assert torch.equal(sf[~torch.isnan(sf)].view(torch.int32), want_sf[~torch.isnan(want_sf)].view(torch.int32))
    codes, want = q.view(torch.uint8).clone(), want_q.view(torch.uint8).clone()
    assert bool(((codes[128:, 5] & 0x7F) == 0x7F).all())
    codes[128:, 5] = want[128:, 5] = 0
    assert torch.equal(codes, want)


@pytest.mark.parametrize("arg,call", [
    ("x", lambda: cast_fp8_channel.per_channel_cast_to_fp8(torch.zeros(4, 4, dtype=torch.int32), 128, False)),
    ("x", lambda: cast_fp8_channel.per_channel_cast_to_fp8(torch.zeros(4, 4, 4, 4), 128, False)),
    ("x", lambda: cast_fp8_channel.per_channel_cast_to_fp8(torch.zeros(4, 4).T, 128, False)),
    ("gran_k", lambda: cast_fp8_channel.per_channel_cast_to_fp8(torch.zeros(4, 4), 256, False)),
    ("gran_k", lambda: cast_fp8_channel.per_channel_cast_to_fp8(torch.zeros(4, 4), 0, False)),
    ("use_ue8m0", lambda: cast_fp8_channel.per_channel_cast_to_fp8(torch.zeros(4, 4), 128, 1)),
], ids=["dtype", "dims", "strides", "gran_k big", "gran_k 0", "use_ue8m0"])
def test_bad_arguments_are_refused_before_launch(arg, call):
    with pytest.raises(ContractError, match=f"'{arg}'"):
        call()


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_quick_conformance_is_served_by_triton(conformance_report, arch):
    r = conformance_report("nvidia", arch=arch).ops[OP]
    assert r.ok and r.passed == r.cases > 0 and r.providers == {"triton": r.passed}, r
