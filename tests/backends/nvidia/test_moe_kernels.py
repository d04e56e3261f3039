"""The Triton MoE routing kernels (gate, expand, reduce) against the contracts' references."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from portable_kernels.backends.nvidia.kernels import moe_expand, moe_gate, moe_reduce  # noqa: E402
from portable_kernels.ops.moe_routing import (expand_to_fused_reference, fused_mapping_reference,  # noqa: E402
                                          reduce_fused_reference, top2_sum_gate_reference)
from portable_kernels.testing.generators import generator, poison, randn  # noqa: E402
from portable_kernels.testing.moe_routing_cases import check_gate, random_topk_idx, tied_gate_logits  # noqa: E402

GATES = [  # t, e, k, topk_groups, groups, factor, scoring, normalize, bias, mask
    (16, 64, 8, 4, 8, 2.5, "sigmoid", True, True, False),
    (7, 32, 4, 2, 4, 1.0, "sigmoid", False, True, True),
    (9, 16, 3, 0, 0, 1.5, "sqrtsoftplus", True, False, False),
    (5, 24, 6, 3, 3, 1.0, "sigmoid", True, True, False),
    (3, 24, 2, 2, 8, 1.0, "sqrtsoftplus", True, True, False),  # groups of 3 experts
    (40, 256, 8, 4, 8, 2.5, "sigmoid", True, True, True),
    (16, 64, 8, 4, 8, 2.5, "softmax", True, True, False),
    (9, 32, 6, 0, 0, 1.0, "softmax", False, False, True),
]


@pytest.mark.parametrize("spec", GATES, ids=str)
def test_gate_is_a_valid_choice(spec):
    t, e, k, tg, g, factor, scoring, normalize, with_bias, with_mask = spec
    logits, bias = randn(t, e, seed=e, scale=4.0), randn(e, seed=e + 1, scale=0.1)
    bias = bias if with_bias else None
    mask = (torch.rand(t, generator=generator(3)) > 0.3) if with_mask else None
    idx, w = moe_gate.top2_sum_gate(logits, bias, k, tg, g, factor, scoring, normalize, mask)
    check_gate(logits, bias, k, tg, g, idx, w, routed_scaling_factor=factor, scoring_func=scoring,
               normalize=normalize, mask=mask)


def test_gate_breaks_exact_ties_by_smaller_index():
    logits, bias = tied_gate_logits(6, 32, 8, seed=4)
    idx, _ = moe_gate.top2_sum_gate(logits, bias, 4, 2, 8)
    assert torch.equal(idx, top2_sum_gate_reference(logits, bias, 4, 2, 8)[0])


def test_gate_keeps_fixed_routes_with_fresh_weights():
    logits, bias = randn(6, 32, seed=7, scale=3.0), randn(32, seed=8, scale=0.1)
    fixed = torch.randint(0, 32, (6, 4), generator=generator(9))
    fix = torch.tensor([True, False, True, False, False, True])
    idx, w = moe_gate.top2_sum_gate(logits, bias, 4, 2, 4, 2.0, "softmax", True, None, fixed, fix)
    want_idx, want_w = top2_sum_gate_reference(logits, bias, 4, 2, 4, 2.0, "softmax", True, None, fixed, fix)
    assert torch.equal(idx, want_idx) and torch.equal(idx[fix], fixed[fix])
    torch.testing.assert_close(w, want_w, rtol=1e-6, atol=0)


def _mapping(t, k, e, alignment, seed):
    topk_idx = random_topk_idx(t, k, e, seed)
    rows = -(-(t * k + (alignment - 1) * e) // alignment) * alignment
    pte, _, _, ttp, *_ = fused_mapping_reference(topk_idx, e, rows, alignment)
    return ttp, pte


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float32])
def test_expand_copies_bits_and_zeroes_padding(dtype):
    t, k, e, h = 9, 3, 4, 300
    ttp, pte = _mapping(t, k, e, 8, seed=1)
    x = randn(t, h, seed=2).to(dtype)
    sf = randn(t, 3, seed=3)
    out = poison(pte.numel(), h, dtype=torch.float32).to(dtype)
    padded = -(-pte.numel() // 4) * 4
    out_sf = torch.full((3, padded), float("nan"))[:, :pte.numel()].T  # TMA-aligned MN-major
    moe_expand.expand_to_fused(x, sf, ttp, pte, out, out_sf)
    want, want_sf = expand_to_fused_reference(x, ttp, pte, sf)
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8)) if dtype == torch.float8_e4m3fn else \
        torch.equal(out, want)
    assert torch.equal(out_sf, want_sf)


@pytest.mark.parametrize("dtype,fp8", [(torch.bfloat16, False), (torch.float32, False), (torch.float32, True)])
@pytest.mark.parametrize("weighted", [False, True])
def test_reduce(dtype, fp8, weighted):
    t, k, e, h = 11, 4, 5, 700
    ttp, pte = _mapping(t, k, e, 16, seed=5)
    x = randn(pte.numel(), h, seed=6, scale=30.0).to(dtype)
    x[pte < 0] = float("nan")  # padding rows must never be read
    w = torch.rand(t, k, generator=generator(7)) if weighted else None
    x_sf = torch.rand(pte.numel(), generator=generator(8)) if weighted else None
    sf = torch.tensor([0.5]) if fp8 else None
    out = torch.empty(t, h, dtype=torch.float8_e4m3fn if fp8 else dtype)
    moe_reduce.reduce_fused(x, x_sf, w, ttp, sf, fp8, out)
    want = reduce_fused_reference(x, w, ttp, x_sf, sf, fp8)
    # one fma per term, in slot order, as the reference: the same bytes
    assert torch.equal(out.view(torch.uint8), want.to(out.dtype).view(torch.uint8))
