"""The cpu backend's native MoE routing (backends/cpu/providers/routing.py, kernels/routing.cpp): the gate picks exactly the
reference's experts (groups, bias, ties, mask), expand copies bit for bit and zeroes the rest (scales
with any strides), reduce sums in fp32 like the reference (bf16, fp32 and fp8 outputs)."""

from __future__ import annotations

import pytest
import torch

from portable_kernels.backends.cpu.providers import routing as nr
from portable_kernels.core.errors import ContractError
from portable_kernels.ops.moe_routing.expand import expand_to_fused_reference
from portable_kernels.ops.moe_routing.gate import top2_sum_gate_reference
from portable_kernels.ops.moe_routing.reduce import reduce_fused_reference
from portable_kernels.core.numerics import calc_diff
from portable_kernels.testing.generators import randn

pytestmark = pytest.mark.skipif(not nr.LIB.get(), reason=f"native routing unavailable: {nr.LIB.reason()}")


@pytest.mark.parametrize("t,e,k,kg,g", [(1, 8, 2, 0, 0), (37, 256, 8, 4, 8), (5, 64, 6, 2, 4), (3, 16, 16, 1, 1)])
@pytest.mark.parametrize("scoring", ["sigmoid", "sqrtsoftplus", "softmax"])
def test_gate_picks_the_reference_experts(t, e, k, kg, g, scoring):
    logits = randn(t, e, seed=t + e, scale=2.0)
    logits[0, : e // 2] = 0.5  # ties inside and across groups
    bias = randn(e, seed=3, scale=0.1)
    mask = torch.ones(t, dtype=torch.bool)
    mask[::2] = False
    idx, w = nr.top2_sum_gate_native(logits, bias, k, kg, g, 2.5, scoring, True, mask)
    want_idx, want_w = top2_sum_gate_reference(logits, bias, k, kg, g, 2.5, scoring, True, mask)
    assert torch.equal(idx, want_idx)
    assert calc_diff(w, want_w) < 1e-12 and bool((w[~mask] == 0).all())


def test_gate_without_normalisation_or_bias():
    logits = randn(9, 32, seed=5)
    idx, w = nr.top2_sum_gate_native(logits, None, 4, 0, 0, 1.0, "sigmoid", False, None)
    want_idx, want_w = top2_sum_gate_reference(logits, None, 4, 0, 0, 1.0, "sigmoid", False, None)
    assert torch.equal(idx, want_idx) and torch.equal(w, want_w)


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_expand_copies_bits_and_zeroes_unmapped_rows(idx_dtype):
    t, h, p = 6, 40, 16
    x = randn(t, h, seed=1).to(torch.float8_e4m3fn)
    x_sf = randn(t, 3, seed=2).abs()
    ttp = torch.tensor([[0, 5], [1, -1], [2, 9], [-1, -1], [3, 10], [4, 15]], dtype=idx_dtype)
    pos_to_expert = torch.zeros(p, dtype=torch.int32)
    out = torch.full((p, h), 7, dtype=torch.uint8).view(torch.float8_e4m3fn)
    out_sf = torch.full((3, p), float("nan")).T  # MN-major scales: any strides are fine
    nr.expand_native(x, x_sf, ttp, out, out_sf)
    want, want_sf = expand_to_fused_reference(x, ttp, pos_to_expert, x_sf)
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(out_sf, want_sf)


@pytest.mark.parametrize("dtype,fp8", [(torch.bfloat16, False), (torch.float32, False), (torch.bfloat16, True)])
@pytest.mark.parametrize("with_sf", [False, True])
def test_reduce_sums_like_the_reference(dtype, fp8, with_sf):
    p, h, t, k = 20, 300, 7, 3
    x = randn(p, h, seed=4, dtype=dtype, scale=50.0)
    weights = randn(t, k, seed=5).abs()
    ttp = torch.randint(-1, p, (t, k), generator=torch.Generator().manual_seed(6), dtype=torch.int32)
    x_sf = randn(p, seed=7).abs() if with_sf else None
    sf = torch.tensor([0.5]) if fp8 else None
    out = torch.empty(t, h, dtype=torch.float8_e4m3fn if fp8 else dtype)
    nr.reduce_native(x, x_sf, weights, ttp, sf, fp8, out)
    want = reduce_fused_reference(x, weights, ttp, x_sf, sf, fp8).to(out.dtype)
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))  # one fma per term, as the reference


def test_routing_refuses_bad_arguments():
    with pytest.raises(ContractError, match="'out'"):
        nr.reduce_native(randn(4, 8, seed=1), None, None, torch.zeros(2, 1, dtype=torch.int32), None, False,
                         torch.empty(2, 9))
    with pytest.raises(ContractError, match="'logits'"):
        nr.top2_sum_gate_native(randn(2, 8, seed=1).double(), None, 2, 0, 0)


@pytest.mark.parametrize("t,k,e,align,extra", [(37, 8, 16, 4, 0), (5, 2, 64, 128, 7), (0, 6, 8, 1, 3),
                                               (64, 1, 3, 1, 0), (9, 4, 4, 16, 40)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_fused_mapping_is_the_reference_mapping(t, k, e, align, extra, dtype):
    from portable_kernels.ops.moe_routing.mapping import fused_mapping_reference
    gen = torch.Generator().manual_seed(t * 31 + e)
    idx = torch.randint(0, e, (t, k), generator=gen)
    idx[torch.rand(t, k, generator=gen) < 0.2] = -1  # padding slots
    if e > 3:
        idx[idx == 1] = 2  # an empty expert
    idx = idx.to(dtype)
    counts = torch.bincount(idx[idx >= 0].long(), minlength=e)
    rows = int(((counts + align - 1) // align * align).sum()) + extra
    ours = nr.fused_mapping_native(idx, e, rows, align)
    want = fused_mapping_reference(idx, e, rows, align)
    assert len(ours) == len(want) == 7
    for name, a, b in zip(("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos",
                           "expert_start", "expert_end", "num_tokens_per_expert"), ours, want):
        assert a.dtype == torch.int32 and torch.equal(a, b), name


def test_fused_mapping_refuses_a_foreign_expert_and_a_short_buffer():
    idx = torch.tensor([[0, 5], [1, 2]])
    with pytest.raises(ContractError, match="topk_idx"):
        nr.fused_mapping_native(idx, 4, 16, 4)
    with pytest.raises(ContractError, match="num_expanded_tokens"):
        nr.fused_mapping_native(torch.tensor([[0, 1], [1, 2]]), 4, 11, 4)  # 3 segments of 4 rows


def test_public_get_fused_mapping_runs_native():
    import portable_kernels as pk
    from portable_kernels.core.dispatch import trace_providers
    idx = torch.tensor([[3, 0], [0, -1], [2, 3]])
    with trace_providers() as ran:
        m = pk.get_fused_mapping(idx, 4, 0, 4)
    assert ("get_fused_mapping", "cpu", "native") in ran
    assert m.num_tokens_per_expert_list == [4, 0, 4, 4] and m.token_topk_to_pos.tolist() == [[8, 0], [1, -1], [4, 9]]
