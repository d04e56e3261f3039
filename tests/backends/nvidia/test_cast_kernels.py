"""The Triton quantizers against the contract's torch references, byte for byte, in each scale form."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from portable_kernels.backends.nvidia.kernels import cast_fp4, cast_fp8, swiglu_cast  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.ops.quant.fp4 import quantize_fp4_reference  # noqa: E402
from portable_kernels.ops.swiglu import (swiglu_clamp_counts, swiglu_forward_and_per_token_cast_reference,  # noqa: E402
                                         swiglu_rows)
from portable_kernels.layouts import (sm100_ue8m0_encode, sm100_ue8m0_encode_from_blocks,  # noqa: E402
                                      sm90_sfa_encode)
from portable_kernels.layouts.fp4 import e2m1_encode_ties_toward_zero, pack_e2m1  # noqa: E402
from portable_kernels.ops.quant.fp8 import quantize_blocks_reference  # noqa: E402
from portable_kernels.testing.generators import randn  # noqa: E402


def _expected_storage(sf: torch.Tensor, form: str, rows: int, gran_mn: int) -> torch.Tensor:
    if form == "plain" or (form == "sm90" and gran_mn > 1):
        return sf
    if form == "sm90":
        return sm90_sfa_encode(sf)
    return sm100_ue8m0_encode(sf) if gran_mn == 1 else sm100_ue8m0_encode_from_blocks(sf, rows, gran_mn)


def _same_storage(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Same values, same strides, and the same bytes in the whole storage (pads included)."""
    def storage(t):
        return torch.as_strided(t, (t.untyped_storage().nbytes() // t.element_size(),), (1,)).view(torch.uint8)
    return got.stride() == want.stride() and torch.equal(got, want) and torch.equal(storage(got), storage(want))


CASES = [((1, 128), (1, 128)), ((3, 300), (1, 128)), ((130, 7), (1, 128)), ((2, 70, 200), (1, 64)),
         ((130, 300), (128, 128)), ((2, 40, 260), (32, 128)), ((5, 9), (3, 5))]


@pytest.mark.parametrize("form", ["plain", "sm90", "sm100"])
@pytest.mark.parametrize("shape,gran", CASES, ids=str)
def test_fp8_cast_bytes(form, shape, gran):
    ue8m0 = form == "sm100" or gran == (1, 64)
    x = randn(*shape, seed=sum(shape), dtype=torch.bfloat16, scale=3.0)
    x.view(-1)[::17] = 0.0  # exact zeros and an all-zero-ish block edge
    q, sf = cast_fp8.cast_to_fp8(x, gran, ue8m0, form)
    want_q, want_sf = quantize_blocks_reference(x, gran[0], gran[1], ue8m0)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert _same_storage(sf, _expected_storage(want_sf, form, shape[-2], gran[0]))


def test_fp8_cast_saturates_and_handles_tiny_blocks():
    x = torch.tensor([[1e-30, -1e-30] + [0.0] * 126, [1000.0, -3.0] + [1e-3] * 126])
    q, sf = cast_fp8.cast_to_fp8(x, (1, 128), False, "plain")
    want_q, want_sf = quantize_blocks_reference(x, 1, 128, False)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(sf, want_sf)


@pytest.mark.parametrize("gran", [(1, 128), (128, 128)], ids=str)
def test_fp8_cast_multiplying_by_the_inverse_is_deep_gemms_rounding(gran):
    # non-power-of-two scales, where x / sf and x * (1 / sf) differ at a few rounding ties
    x = randn(512, 1024, seed=11, scale=7.0, dtype=torch.bfloat16)
    q, sf = cast_fp8.cast_to_fp8(x, gran, False, "plain", multiply_by_inverse=True)
    want_q, want_sf = quantize_blocks_reference(x, gran[0], gran[1], False, convention="deep_gemm")
    portable_q, _ = quantize_blocks_reference(x, gran[0], gran[1], False)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(sf, want_sf)
    assert not torch.equal(want_q.view(torch.uint8), portable_q.view(torch.uint8))  # the input tells them apart
    with pytest.raises(ContractError, match="multiply_by_inverse"):
        cast_fp8.cast_to_fp8(x, gran, False, "plain", multiply_by_inverse="yes")


def test_fp8_cast_empty_and_refusals():
    q, sf = cast_fp8.cast_to_fp8(torch.empty(0, 256), (1, 128), True, "sm100")
    assert q.shape == (0, 256) and sf.shape == (0, 1)
    with pytest.raises(ContractError, match="use_ue8m0"):
        cast_fp8.cast_to_fp8(torch.ones(2, 128), (1, 128), False, "sm100")
    with pytest.raises(ContractError, match="gran_k"):
        cast_fp8.cast_to_fp8(torch.ones(2, 512), (1, 256), False, "plain")


@pytest.mark.parametrize("form", ["plain", "sm90", "sm100"])
@pytest.mark.parametrize("shape,gran_k", [((3, 64), 32), ((17, 200), 32), ((2, 5, 256), 128), ((4, 6), 4)], ids=str)
def test_fp4_cast_bytes(form, shape, gran_k):
    ue8m0 = form == "sm100" or gran_k == 32
    x = randn(*shape, seed=sum(shape), scale=2.0)
    x.view(-1)[::13] = -0.0
    q, sf = cast_fp4.cast_to_fp4(x, gran_k, ue8m0, form)
    want_q, want_sf = quantize_fp4_reference(x, gran_k, ue8m0)
    assert torch.equal(q, want_q)
    assert _same_storage(sf, _expected_storage(want_sf, form, shape[-2], 1))


def test_fp4_codes_round_ties_to_even_and_keep_the_sign():
    # per-block scale 1 (amax 6): values are the codes' grid, their midpoints and tiny negatives
    row = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, -0.0, 7.0, -5.5, 0.5, 1.0, 4.0, 3.0] * 2)
    q, _ = cast_fp4.cast_to_fp4(row[None], 32, False, "plain")
    want, _ = quantize_fp4_reference(row[None], 32, False)
    assert torch.equal(q, want)


@pytest.mark.parametrize("form", ["plain", "sm90", "sm100"])
@pytest.mark.parametrize("shape,gran_k", [((17, 200), 32), ((2, 5, 256), 128), ((64, 96), 16)], ids=str)
def test_fp4_cast_deep_gemm_bytes(form, shape, gran_k):
    ue8m0 = form == "sm100" or gran_k == 32
    x = randn(*shape, seed=sum(shape) + 1, scale=2.0)
    x.view(-1)[::13] = -0.0
    q, sf = cast_fp4.cast_to_fp4(x, gran_k, ue8m0, form, convention="deep_gemm")
    want_q, want_sf = quantize_fp4_reference(x, gran_k, ue8m0, convention="deep_gemm")
    assert torch.equal(q, want_q)
    assert _same_storage(sf, _expected_storage(want_sf, form, shape[-2], 1))


def test_fp4_deep_gemm_codes_round_ties_toward_zero_and_zero_is_positive():
    # per-block scale 1 (amax 6): the codes' grid, every midpoint, tiny negatives and -0
    row = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, -0.0, 7.0, -5.5, 0.5, -0.75, 4.0, 3.0] * 2)
    q, _ = cast_fp4.cast_to_fp4(row[None], 32, False, "plain", convention="deep_gemm")
    want, _ = quantize_fp4_reference(row[None], 32, False, convention="deep_gemm")
    portable, _ = quantize_fp4_reference(row[None], 32, False)
    assert torch.equal(q, want)
    assert not torch.equal(want, portable)  # the ties and the zeros tell the conventions apart


def test_fp4_deep_gemm_multiplies_by_the_inverse():
    """Non-power-of-two scales: x * (1 / sf) and x / sf land on different sides of a midpoint
    somewhere in this input, and the kernel follows the product."""
    x = randn(512, 1024, seed=21, scale=5.0, dtype=torch.bfloat16)
    q, sf = cast_fp4.cast_to_fp4(x, 32, False, "plain", convention="deep_gemm")
    want_q, want_sf = quantize_fp4_reference(x, 32, False, convention="deep_gemm")
    assert torch.equal(q, want_q) and torch.equal(sf, want_sf)
    blocks = x.float().view(512, 32, 32)
    divided = pack_e2m1(e2m1_encode_ties_toward_zero((blocks / want_sf[..., None]).view(512, 1024)))
    assert not torch.equal(divided, want_q)


def test_fp4_cast_refuses_an_unknown_convention():
    with pytest.raises(ContractError, match="convention"):
        cast_fp4.cast_to_fp4(torch.ones(2, 32), 32, True, "plain", convention="nearest")


@pytest.mark.parametrize("form", ["plain", "sm90", "sm100"])
@pytest.mark.parametrize("npc", [128, 32, 300])
def test_swiglu_cast_matches_reference(form, npc):
    m, i = 21, 300
    round_sf = form == "sm100"
    x = randn(m, 2 * i, seed=npc, dtype=torch.bfloat16, scale=2.0)
    weights = torch.rand(7, 3, generator=torch.Generator().manual_seed(1))
    slots = torch.randint(-1, 21, (m,), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    experts = torch.randint(-1, 4, (m,), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    count = torch.zeros(3, dtype=torch.int64)
    q, sf = swiglu_cast.swiglu_cast(x, npc, round_sf, slots, weights, experts, 1.5, count, form)
    want_q, want_sf = swiglu_forward_and_per_token_cast_reference(x, npc, round_sf, slots, weights, experts, 1.5)
    valid, _ = swiglu_rows(m, slots, weights, experts, x.device)
    assert torch.equal(count, swiglu_clamp_counts(x, valid, 1.5))
    # silu's exp may differ from torch's by an ulp: scales within a few ulp, codes within one step
    want_storage = _expected_storage(want_sf, form, m, 1)
    assert sf.stride() == want_storage.stride()
    torch.testing.assert_close(sf, want_storage, rtol=2 ** -21, atol=0)
    step = (q.view(torch.uint8).int() - want_q.view(torch.uint8).int()).abs()
    assert int((step > 1).sum()) == 0 and int((step == 1).sum()) <= 0.01 * step.numel()


def test_swiglu_cast_without_routing_arguments():
    x = randn(4, 256, seed=5, scale=2.0)
    q, sf = swiglu_cast.swiglu_cast(x, 128, False)
    want_q, want_sf = swiglu_forward_and_per_token_cast_reference(x, 128, False)
    torch.testing.assert_close(sf, want_sf, rtol=2 ** -21, atol=0)
    assert int(((q.view(torch.uint8).int() - want_q.view(torch.uint8).int()).abs() > 1).sum()) == 0


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # numpy, inside the interpreter's reductions
def test_fp8_cast_non_finite_blocks():
    """NaN in a block: NaN scale, like torch's amax; Inf: inf scale. With UE8M0 such a block has no
    scale: NaN (exponent byte 0xFF in sm100 words), which the provider turns into the contract's error."""
    x = randn(3, 256, seed=9)
    x[0, 5], x[1, 200] = float("nan"), float("inf")
    q, sf = cast_fp8.cast_to_fp8(x, (1, 128), False, "plain")
    want_q, want_sf = quantize_blocks_reference(x, 1, 128, False)
    assert torch.equal(torch.isnan(sf), torch.isnan(want_sf)) and torch.equal(sf.isinf(), want_sf.isinf())
    assert torch.equal(sf[torch.isfinite(sf)], want_sf[torch.isfinite(want_sf)])
    finite_rows = torch.isfinite(sf).all(dim=1)
    assert torch.equal(q[finite_rows].view(torch.uint8), want_q[finite_rows].view(torch.uint8))
    _, sf8 = cast_fp8.cast_to_fp8(x, (1, 128), True, "plain")
    assert torch.isnan(sf8[0, 0]) and torch.isnan(sf8[1, 1]) and torch.isfinite(sf8[2]).all()
    _, words = cast_fp8.cast_to_fp8(x, (1, 128), True, "sm100")
    exponents = torch.stack([(words[:, 0] >> s) & 0xFF for s in (0, 8)], dim=1)
    assert exponents[0, 0] == 0xFF and exponents[1, 1] == 0xFF and (exponents[2] != 0xFF).all()
