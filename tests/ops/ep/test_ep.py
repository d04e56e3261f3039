"""Expert-parallel dispatch/combine contract: known answers, properties of the R-rank simulation,
the checks' power to fail, the bad-input catalogue, and the quick conformance run."""

from __future__ import annotations

import attrs
import pytest
import torch

import portable_kernels as pk
from portable_kernels.testing import run_conformance
from portable_kernels.testing.core import CaseFailure
from portable_kernels.testing.ep_cases import (check_combine, check_dispatch, check_dispatch_layout,
                                               check_low_latency_combine, check_low_latency_dispatch,
                                               combine_factor, low_latency_expert_outputs, random_routing)
from portable_kernels.testing.generators import randn

EP_OPS = ["get_dispatch_layout", "simulate_dispatch", "simulate_combine", "simulate_low_latency_dispatch",
          "simulate_low_latency_combine"]


def _inputs(sizes, num_topk, num_experts, hidden, seed):
    xs = [randn(n, hidden, seed=seed + 10 * r, dtype=torch.bfloat16) for r, n in enumerate(sizes)]
    idx = [random_routing(n, num_topk, num_experts, seed + 10 * r + 1) for r, n in enumerate(sizes)]
    weights = [randn(n, num_topk, seed=seed + 10 * r + 2).abs() + 0.1 for r, n in enumerate(sizes)]
    return xs, idx, weights


# ---------------------------------------------------------------------------- known answers

#: 4 tokens, E = 4 experts on R = 2 ranks (rank 0: experts 0, 1; rank 1: experts 2, 3)
KNOWN_IDX = torch.tensor([[0, 3], [-1, 1], [2, -1], [-1, -1]])


def test_dispatch_layout_known_answer():
    per_rank, rdma, per_expert, in_rank = pk.get_dispatch_layout(KNOWN_IDX, 4, 2)
    assert per_rank.dtype == torch.int32 and per_rank.tolist() == [2, 2]
    assert rdma is None
    assert per_expert.dtype == torch.int32 and per_expert.tolist() == [1, 1, 1, 1]
    assert in_rank.dtype == torch.bool
    assert in_rank.tolist() == [[True, True], [True, False], [False, True], [False, False]]


def test_dispatch_layout_accepts_int32_and_any_negative_as_no_expert():
    idx = torch.tensor([[0, -7], [5, -1]], dtype=torch.int32)
    per_rank, _, per_expert, in_rank = pk.get_dispatch_layout(idx, 6, 3)
    assert per_rank.tolist() == [1, 0, 1] and per_expert.tolist() == [1, 0, 0, 0, 0, 1]
    assert in_rank.tolist() == [[True, False, False], [False, False, True]]


@pytest.mark.parametrize("tokens,k,experts,ranks", [(0, 3, 6, 3), (50, 8, 64, 8), (33, 6, 160, 16)])
def test_dispatch_layout_matches_a_per_rank_count(tokens, k, experts, ranks):
    idx = random_routing(tokens, k, experts, seed=tokens + experts)
    check_dispatch_layout(idx, experts, ranks, pk.get_dispatch_layout(idx, experts, ranks))


def test_dispatch_known_answer_rows_order_and_remap():
    x0 = randn(4, 128, seed=1, dtype=torch.bfloat16)
    x1 = randn(1, 128, seed=2, dtype=torch.bfloat16)
    idx1 = torch.tensor([[2, 1]])
    w0, w1 = randn(4, 2, seed=3), randn(1, 2, seed=4)
    r0, r1 = pk.simulate_dispatch([x0, x1], [KNOWN_IDX, idx1], [w0, w1], num_experts=4)
    # rank 0 (experts 0, 1): rank 0's tokens 0, 1, then rank 1's token 0
    assert torch.equal(r0.recv_x, torch.cat((x0[[0, 1]], x1)))
    assert r0.recv_topk_idx.tolist() == [[0, -1], [-1, 1], [-1, 1]]
    assert torch.equal(r0.recv_topk_weights, torch.stack((torch.stack((w0[0, 0], torch.tensor(0.0))),
                                                          torch.stack((torch.tensor(0.0), w0[1, 1])),
                                                          torch.stack((torch.tensor(0.0), w1[0, 1])))))
    assert r0.num_recv_tokens_per_expert_list == (1, 2)
    assert r0.handle.recv_src_rank.tolist() == [0, 0, 1] and r0.handle.recv_src_idx.tolist() == [0, 1, 0]
    # rank 1 (experts 2, 3): rank 0's tokens 0, 2, then rank 1's token 0; ids remapped to 0..1
    assert torch.equal(r1.recv_x, torch.cat((x0[[0, 2]], x1)))
    assert r1.recv_topk_idx.tolist() == [[-1, 1], [0, -1], [0, -1]]
    assert r1.handle.rank_prefix_matrix.tolist() == [[2, 2], [3, 3]]


def test_dispatch_result_unpacks_like_deep_ep():
    xs, idx, w = _inputs([3, 2], 2, 4, 128, seed=5)
    recv_x, recv_idx, recv_w, counts, handle = pk.simulate_dispatch(xs, idx, w, 4)[1]
    assert isinstance(handle, pk.DispatchHandle) and handle.rank == 1
    assert recv_x.shape[0] == recv_idx.shape[0] == recv_w.shape[0]
    assert sum(counts) == int((recv_idx >= 0).sum())
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        handle.rank = 0


# ---------------------------------------------------------------------------- normal mode properties

SHAPES = [([0, 1], 2, 4, 128), ([1], 1, 2, 128), ([5, 9, 2], 3, 12, 256), ([17, 16, 15, 31], 4, 16, 128),
          ([40] * 8, 8, 64, 256)]


@pytest.mark.parametrize("sizes,k,experts,hidden", SHAPES)
@pytest.mark.parametrize("alignment", [1, 4, 128])
def test_dispatch_properties(sizes, k, experts, hidden, alignment):
    xs, idx, w = _inputs(sizes, k, experts, hidden, seed=len(sizes) + k + alignment)
    check_dispatch(xs, idx, w, experts, alignment, pk.simulate_dispatch(xs, idx, w, experts, alignment))


def test_dispatch_moves_fp8_tokens_with_their_scales():
    xs, idx, w = _inputs([6, 3, 7], 3, 6, 384, seed=7)
    q = [pk.per_token_cast_to_fp8(x) for x in xs]
    pairs = [(t.data, t.scale) for t in q]
    results = pk.simulate_dispatch(pairs, idx, w, 6)
    check_dispatch(pairs, idx, w, 6, 1, results)
    from_quant = pk.simulate_dispatch(q, idx, w, 6)  # a QuantTensor travels like its pair
    assert all(torch.equal(a.recv_x[1], b.recv_x[1]) for a, b in zip(results, from_quant))


def test_dispatch_keeps_int32_topk_idx_and_allows_no_weights():
    xs, idx, _ = _inputs([4, 5], 2, 8, 128, seed=8)
    idx = [t.to(torch.int32) for t in idx]
    results = pk.simulate_dispatch(xs, idx, None, 8)
    check_dispatch(xs, idx, None, 8, 1, results)
    assert all(r.recv_topk_idx.dtype == torch.int32 and r.recv_topk_weights is None for r in results)


def test_cached_dispatch_reuses_the_layout():
    xs, idx, w = _inputs([5, 6, 4], 3, 9, 128, seed=9)
    first = pk.simulate_dispatch(xs, idx, w, 9)
    other = [randn(*x.shape, seed=99 + r, dtype=torch.bfloat16) for r, x in enumerate(xs)]
    cached = pk.simulate_dispatch(other, handles=[r.handle for r in first])
    fresh = pk.simulate_dispatch(other, idx, w, 9)
    for c, f, a in zip(cached, fresh, first):
        assert torch.equal(c.recv_x, f.recv_x)
        assert c.recv_topk_idx is None and c.num_recv_tokens_per_expert_list is None and c.handle is a.handle


@pytest.mark.parametrize("sizes,k,experts,hidden", SHAPES)
def test_combine_of_dispatch_sums_over_distinct_destinations(sizes, k, experts, hidden):
    xs, idx, w = _inputs(sizes, k, experts, hidden, seed=20 + len(sizes))
    sent = pk.simulate_dispatch(xs, idx, w, experts)
    back = [(r.recv_x.float() * (d + 1)).bfloat16() for d, r in enumerate(sent)]
    combined = pk.simulate_combine(back, [r.handle for r in sent], [r.recv_topk_weights for r in sent])
    assert check_combine(xs, idx, w, experts, combined) <= pk.get_contract("simulate_combine").tolerance.dequantized


def test_combine_is_unweighted_and_zero_for_tokens_sent_nowhere():
    xs, idx, w = _inputs([6, 6], 4, 4, 128, seed=21)
    sent = pk.simulate_dispatch(xs, idx, w, 4)
    (x0, w0), (x1, w1) = pk.simulate_combine([r.recv_x for r in sent], [r.handle for r in sent])
    assert w0 is None and w1 is None
    for x, t, got in ((xs[0], idx[0], x0), (xs[1], idx[1], x1)):
        copies = pk.get_dispatch_layout(t, 4, 2)[3].sum(dim=1)
        assert pk.calc_diff(got, x.double() * copies[:, None]) <= 1e-5
        assert torch.equal(got[-1], torch.zeros_like(got[-1]))  # the last token has no expert
    assert x0.dtype == torch.bfloat16


def test_combine_follows_the_handle_when_rows_move_with_their_source_indices():
    xs, idx, w = _inputs([6, 5], 3, 4, 128, seed=22)
    sent = pk.simulate_dispatch(xs, idx, w, 4)
    back = [(r.recv_x.float() * (d + 1)).bfloat16() for d, r in enumerate(sent)]
    want = pk.simulate_combine(back, [r.handle for r in sent])
    # the rows of one source rank's block may be reordered freely when their indices move along
    block = int(sent[0].handle.rank_prefix_matrix[0, 0])
    order = torch.randperm(back[0].shape[0], generator=torch.Generator().manual_seed(3))
    order = torch.cat((order[order < block], order[order >= block]))
    assert not torch.equal(order, torch.arange(order.numel()))
    moved = attrs.evolve(sent[0].handle, recv_src_idx=sent[0].handle.recv_src_idx[order])
    got = pk.simulate_combine([back[0][order], back[1]], [moved, sent[1].handle])
    assert all(torch.equal(a.combined_x, b.combined_x) for a, b in zip(got, want))


def test_combine_factor_counts_each_destination_rank_once():
    idx = torch.tensor([[0, 1, 2], [3, -1, -1], [-1, -1, -1]])
    assert combine_factor(idx, 4, 2).tolist() == [1.0 + 2.0, 2.0, 0.0]


# ---------------------------------------------------------------------------- low-latency mode

def test_low_latency_dispatch_known_answer():
    x0 = randn(4, 128, seed=30, dtype=torch.bfloat16)
    x1 = randn(1, 128, seed=31, dtype=torch.bfloat16)
    r0, r1 = pk.simulate_low_latency_dispatch([x0, x1], [KNOWN_IDX, torch.tensor([[2, 1]])], 4, 4, use_fp8=False)
    assert r0.recv_x.shape == (2, 8, 128) and r0.recv_count.tolist() == [1, 2]
    assert torch.equal(r0.recv_x[0, 0], x0[0]) and torch.equal(r0.recv_x[1, :2], torch.cat((x0[[1]], x1)))
    assert r0.handle.recv_src_info[1, :2].tolist() == [1, 0]
    assert r0.handle.recv_src_rank[1, :3].tolist() == [0, 1, -1]
    # expert 1 on rank 0: one token from each rank -> ranges (begin 0, count 1), (begin 1, count 1)
    assert r0.handle.range_begin[1].tolist() == [0, 1] and r0.handle.range_count[1].tolist() == [1, 1]
    assert r1.recv_count.tolist() == [2, 1]  # expert 2: rank 0 token 2 and rank 1 token 0; expert 3: token 0
    assert torch.equal(r1.recv_x[0, 2:], torch.zeros(6, 128, dtype=torch.bfloat16))


@pytest.mark.parametrize("sizes,k,experts,hidden", SHAPES)
@pytest.mark.parametrize("use_fp8,round_scale", [(False, False), (True, False), (True, True)])
def test_low_latency_dispatch_properties(sizes, k, experts, hidden, use_fp8, round_scale):
    xs, idx, _ = _inputs(sizes, k, experts, hidden, seed=40 + len(sizes))
    max_tokens = max(sizes) + 1
    results = pk.simulate_low_latency_dispatch(xs, idx, max_tokens, experts, use_fp8, round_scale)
    worst = check_low_latency_dispatch(xs, idx, experts, max_tokens, use_fp8, round_scale, results)
    assert worst <= pk.get_contract("simulate_low_latency_dispatch").tolerance.unquantized


def test_low_latency_round_scale_gives_power_of_two_scales():
    xs, idx, _ = _inputs([8, 8], 2, 4, 256, seed=41)
    for res in pk.simulate_low_latency_dispatch(xs, idx, 8, 4, use_fp8=True, round_scale=True):
        scale = res.recv_x[1]
        valid = scale[scale != 0]
        assert valid.numel() and torch.equal(torch.exp2(torch.log2(valid).round()), valid)


def _reverse_source_blocks(res: pk.LowLatencyDispatchResult) -> pk.LowLatencyDispatchResult:
    """The same receive written in another legal order: each expert's source-rank blocks reversed."""
    h = res.handle
    count = h.range_count
    begin = count.flip(1).cumsum(1).flip(1) - count  # the last rank's block first
    src_rank = h.recv_src_rank.long()
    rank_begin = torch.gather(begin, 1, src_rank.clamp(min=0))
    old_begin = torch.gather(h.range_begin, 1, src_rank.clamp(min=0))
    slots = torch.arange(src_rank.shape[1]).expand_as(src_rank)
    new_slot = torch.where(src_rank >= 0, rank_begin + slots - old_begin, slots)
    x = torch.zeros_like(res.recv_x).scatter_(1, new_slot[..., None].expand_as(res.recv_x), res.recv_x)
    info = torch.full_like(h.recv_src_info, -1).scatter_(1, new_slot, h.recv_src_info)
    handle = pk.LowLatencyHandle(info, (begin << 32) | count, h.num_max_dispatch_tokens_per_rank, h.hidden,
                                 h.num_experts)
    return pk.LowLatencyDispatchResult(x, res.recv_count, handle)


def test_low_latency_order_inside_an_expert_is_compared_after_sorting_by_source():
    xs, idx, w = _inputs([6, 7, 5], 3, 6, 128, seed=42)
    results = pk.simulate_low_latency_dispatch(xs, idx, 7, 6, use_fp8=False)
    shuffled = [_reverse_source_blocks(r) for r in results]
    assert any(not torch.equal(a.recv_x, b.recv_x) for a, b in zip(results, shuffled))
    check_low_latency_dispatch(xs, idx, 6, 7, False, False, shuffled)
    for a, b in zip(results, shuffled):
        sa, sb = a.sorted_by_source(), b.sorted_by_source()
        assert torch.equal(sa.recv_x, sb.recv_x) and torch.equal(sa.handle.recv_src_info, sb.handle.recv_src_info)
        assert torch.equal(sa.handle.recv_layout_range, sb.handle.recv_layout_range)
    # the combine reads the layout from the handles, so any legal order combines to the same sums
    a = pk.simulate_low_latency_combine(low_latency_expert_outputs(results), idx, w, [r.handle for r in results])
    b = pk.simulate_low_latency_combine(low_latency_expert_outputs(shuffled), idx, w, [r.handle for r in shuffled])
    assert all(torch.equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize("sizes,k,experts,hidden", SHAPES)
@pytest.mark.parametrize("use_fp8", [False, True])
def test_low_latency_combine_is_the_weighted_sum_and_skips_unused_slots(sizes, k, experts, hidden, use_fp8):
    xs, idx, w = _inputs(sizes, k, experts, hidden, seed=50 + len(sizes))
    results = pk.simulate_low_latency_dispatch(xs, idx, max(sizes) + 2, experts, use_fp8)
    outs = low_latency_expert_outputs(results)  # unused slots hold NaN
    combined = pk.simulate_low_latency_combine(outs, idx, w, [r.handle for r in results])
    worst = check_low_latency_combine(xs, idx, w, use_fp8, False, combined)
    assert worst <= pk.get_contract("simulate_low_latency_combine").tolerance.dequantized


def _permute_within_source_ranges(res: pk.LowLatencyDispatchResult, seed: int) -> pk.LowLatencyDispatchResult:
    """Rows and recv_src_info reordered together inside each (expert, source rank) range: still legal."""
    h = res.handle
    src_rank = h.recv_src_rank.long()
    noise = torch.rand(src_rank.shape, generator=torch.Generator().manual_seed(seed))
    key = torch.where(src_rank >= 0, src_rank.double() + noise.double(), float(h.num_ranks + 1))
    order = key.argsort(dim=1)
    x = torch.take_along_dim(res.recv_x, order[..., None], dim=1)
    info = torch.take_along_dim(h.recv_src_info, order, dim=1)
    return pk.LowLatencyDispatchResult(x, res.recv_count, attrs.evolve(h, recv_src_info=info))


def test_low_latency_combine_follows_the_handle_inside_each_source_range():
    xs, idx, w = _inputs([7, 6, 8], 3, 6, 128, seed=53)
    results = pk.simulate_low_latency_dispatch(xs, idx, 8, 6, use_fp8=False)
    moved = [_permute_within_source_ranges(r, seed=d) for d, r in enumerate(results)]
    assert any(not torch.equal(a.handle.recv_src_info, b.handle.recv_src_info) for a, b in zip(results, moved))
    a = pk.simulate_low_latency_combine(low_latency_expert_outputs(results), idx, w, [r.handle for r in results])
    b = pk.simulate_low_latency_combine(low_latency_expert_outputs(moved), idx, w, [r.handle for r in moved])
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_low_latency_combine_against_unquantized_tokens():
    xs, idx, w = _inputs([16, 16], 4, 8, 512, seed=51)
    results = pk.simulate_low_latency_dispatch(xs, idx, 16, 8, use_fp8=True)
    rows = low_latency_expert_outputs(results, poison_unused=False)
    ones = [(r.float() / (torch.arange(d * 4, d * 4 + 4) + 1).float()[:, None, None]).bfloat16()
            for d, r in enumerate(rows)]  # undo the per-expert factor: every expert returns its input
    combined = pk.simulate_low_latency_combine(ones, idx, w, [r.handle for r in results])
    for x, t, wt, got in zip(xs, idx, w, combined):
        ref = x.double() * torch.where(t >= 0, wt, 0.0).double().sum(dim=1, keepdim=True)
        assert pk.calc_diff(got, ref) <= 1e-3


def test_low_latency_handle_round_trips_through_a_deep_ep_tuple():
    xs, idx, _ = _inputs([3, 3], 2, 4, 128, seed=52)
    res = pk.simulate_low_latency_dispatch(xs, idx, 4, 4, use_fp8=False)[0]
    recv_x, recv_count, handle = res
    again = pk.LowLatencyHandle(*tuple(handle))
    assert torch.equal(again.recv_layout_range, handle.recv_layout_range) and again.hidden == 128


# ---------------------------------------------------------------------------- the checks can fail

def test_check_dispatch_catches_swapped_rows():
    xs, idx, w = _inputs([6, 6], 3, 4, 128, seed=60)
    results = pk.simulate_dispatch(xs, idx, w, 4)
    bad = attrs.evolve(results[0], recv_x=results[0].recv_x.flip(0))
    with pytest.raises(CaseFailure, match="recv_x"):
        check_dispatch(xs, idx, w, 4, 1, [bad, results[1]])


def test_check_dispatch_catches_an_unremapped_expert_id():
    xs, idx, w = _inputs([6, 6], 3, 4, 128, seed=61)
    results = pk.simulate_dispatch(xs, idx, w, 4)
    global_ids = torch.where(results[1].recv_topk_idx >= 0, results[1].recv_topk_idx + 2, -1)
    with pytest.raises(CaseFailure, match="recv_topk_idx"):
        check_dispatch(xs, idx, w, 4, 1, [results[0], attrs.evolve(results[1], recv_topk_idx=global_ids)])


def test_check_low_latency_dispatch_catches_a_wrong_slot():
    xs, idx, _ = _inputs([6, 6], 3, 4, 128, seed=62)
    results = pk.simulate_low_latency_dispatch(xs, idx, 6, 4, use_fp8=False)
    x = results[0].recv_x.clone()
    x[0, 0] += 1
    with pytest.raises(CaseFailure, match="rows"):
        check_low_latency_dispatch(xs, idx, 4, 6, False, False, [attrs.evolve(results[0], recv_x=x), results[1]])


def test_check_combine_catches_a_weighted_combine():
    xs, idx, w = _inputs([6, 6], 3, 4, 128, seed=63)
    sent = pk.simulate_dispatch(xs, idx, w, 4)
    back = [(r.recv_x.float() * (d + 1) * 1.5).bfloat16() for d, r in enumerate(sent)]
    combined = pk.simulate_combine(back, [r.handle for r in sent])
    with pytest.raises(CaseFailure, match="combined_x"):
        check_combine(xs, idx, None, 4, combined)


# ---------------------------------------------------------------------------- bad inputs

X2 = [randn(3, 128, seed=70, dtype=torch.bfloat16), randn(2, 128, seed=71, dtype=torch.bfloat16)]
IDX2 = [torch.tensor([[0, 3], [1, -1], [2, 0]]), torch.tensor([[3, 2], [-1, -1]])]
W2 = [randn(3, 2, seed=72), randn(2, 2, seed=73)]
Q2 = [pk.per_token_cast_to_fp8(x) for x in X2]


def _with(seq, i, value):
    out = list(seq)
    out[i] = value
    return out


LAYOUT_CASES = {
    "float ids": (lambda: (IDX2[0].float(), 4, 2), "'topk_idx'"),
    "1-D ids": (lambda: (IDX2[0].flatten(), 4, 2), "'topk_idx'"),
    "list of ids": (lambda: (IDX2[0].tolist(), 4, 2), "'topk_idx'"),
    "id >= num_experts": (lambda: (torch.tensor([[0, 4]]), 4, 2), "'topk_idx'"),
    "duplicate expert": (lambda: (torch.tensor([[1, -1], [2, 2]]), 4, 2), "'topk_idx'"),
    "no top-k column": (lambda: (torch.empty(3, 0, dtype=torch.int64), 4, 2), "'topk_idx'"),
    "experts not divisible": (lambda: (IDX2[0], 5, 2), "'num_experts'"),
    "num_experts a bool": (lambda: (IDX2[0], True, 1), "'num_experts'"),
    "num_ranks zero": (lambda: (IDX2[0], 4, 0), "'num_ranks'"),
}


@pytest.mark.parametrize("name", list(LAYOUT_CASES))
def test_get_dispatch_layout_bad_input(name):
    build, arg = LAYOUT_CASES[name]
    with pytest.raises(pk.ContractError, match=arg):
        pk.get_dispatch_layout(*build())


def _handles():
    return [r.handle for r in pk.simulate_dispatch(X2, IDX2, W2, 4)]


DISPATCH_CASES = {
    "xs a tensor": (lambda: dict(xs=X2[0], topk_idx=IDX2, num_experts=4), "'xs'"),
    "xs empty": (lambda: dict(xs=[], topk_idx=IDX2, num_experts=4), "'xs'"),
    "int tokens": (lambda: dict(xs=_with(X2, 1, X2[1].int()), topk_idx=IDX2, num_experts=4), r"'xs\[1\]'"),
    "other hidden": (lambda: dict(xs=_with(X2, 1, X2[1][:, :64]), topk_idx=IDX2, num_experts=4), r"'xs\[1\]'"),
    "mixed fp8 and bf16": (lambda: dict(xs=[Q2[0], X2[1]], topk_idx=IDX2, num_experts=4), r"'xs\[1\]'"),
    "fp8 scales wrong shape": (lambda: dict(xs=[(Q2[0].data, Q2[0].scale[:2]), Q2[1]], topk_idx=IDX2,
                                            num_experts=4), r"'xs\[0\]'"),
    "fp8 hidden not /128": (lambda: dict(xs=[(Q2[0].data[:, :64], torch.ones(3, 1)), Q2[1]], topk_idx=IDX2,
                                         num_experts=4), r"'xs\[0\]'"),
    "fp8 granularity": (lambda: dict(xs=[pk.per_token_cast_to_fp8(X2[0], gran_k=64), Q2[1]], topk_idx=IDX2,
                                     num_experts=4), r"'xs\[0\]'"),
    "one topk_idx for two ranks": (lambda: dict(xs=X2, topk_idx=IDX2[:1], num_experts=4), "'topk_idx'"),
    "topk_idx rows": (lambda: dict(xs=X2, topk_idx=[IDX2[0], IDX2[0]], num_experts=4), r"'topk_idx\[1\]'"),
    "topk_idx other k": (lambda: dict(xs=X2, topk_idx=[IDX2[0], IDX2[1][:, :1]], num_experts=4), r"'topk_idx\[1\]'"),
    "topk_idx on meta": (lambda: dict(xs=X2, topk_idx=[IDX2[0].to("meta"), IDX2[1]], num_experts=4),
                         r"'topk_idx\[0\]'"),
    "id too large": (lambda: dict(xs=X2, topk_idx=[IDX2[0], IDX2[1] + 2], num_experts=4), r"'topk_idx\[1\]'"),
    "fp16 weights": (lambda: dict(xs=X2, topk_idx=IDX2, topk_weights=[W2[0].half(), W2[1]], num_experts=4),
                     r"'topk_weights\[0\]'"),
    "weights wrong shape": (lambda: dict(xs=X2, topk_idx=IDX2, topk_weights=[W2[0], W2[0]], num_experts=4),
                            r"'topk_weights\[1\]'"),
    "no num_experts": (lambda: dict(xs=X2, topk_idx=IDX2), "'num_experts'"),
    "experts not divisible": (lambda: dict(xs=X2, topk_idx=IDX2, num_experts=5), "'num_experts'"),
    "alignment zero": (lambda: dict(xs=X2, topk_idx=IDX2, num_experts=4, expert_alignment=0), "'expert_alignment'"),
    "no topk_idx, no handles": (lambda: dict(xs=X2), "'topk_idx'"),
    "handles and topk_idx": (lambda: dict(xs=X2, topk_idx=IDX2, handles=_handles()), "'topk_idx'"),
    "handles out of order": (lambda: dict(xs=X2, handles=_handles()[::-1]), r"'handles\[0\]'"),
    "handle not a handle": (lambda: dict(xs=X2, handles=[None, None]), r"'handles\[0\]'"),
    "cached with other tokens": (lambda: dict(xs=[X2[1], X2[1]], handles=_handles()), r"'xs\[0\]'"),
}


@pytest.mark.parametrize("name", list(DISPATCH_CASES))
def test_simulate_dispatch_bad_input(name):
    build, arg = DISPATCH_CASES[name]
    with pytest.raises(pk.ContractError, match=arg):
        pk.simulate_dispatch(**build())


def _recv():
    return [r.recv_x for r in pk.simulate_dispatch(X2, IDX2, W2, 4)]


def _other_dispatch_handles():
    other = pk.simulate_dispatch(X2, [torch.tensor([[0, -1]] * 3), IDX2[1]], None, 4)
    return [_handles()[0], other[1].handle]


def _with_src_idx(first: int):
    """Rank 0's handle with its first recv_src_idx replaced."""
    handles = _handles()
    idx = handles[0].recv_src_idx.clone()
    idx[0] = first
    return [attrs.evolve(handles[0], recv_src_idx=idx), handles[1]]


COMBINE_CASES = {
    "source index -1": (lambda: dict(xs=_recv(), handles=_with_src_idx(-1)), r"'handles\[0\]'"),
    "source index past the tokens": (lambda: dict(xs=_recv(), handles=_with_src_idx(3)), r"'handles\[0\]'"),
    "source index repeated": (lambda: dict(xs=_recv(), handles=_with_src_idx(int(_handles()[0].recv_src_idx[1]))),
                              r"'handles\[0\]'"),
    "xs a tensor": (lambda: dict(xs=_recv()[0], handles=_handles()), "'xs'"),
    "rows missing": (lambda: dict(xs=_with(_recv(), 0, _recv()[0][:-1]), handles=_handles()), r"'xs\[0\]'"),
    "dtype differs": (lambda: dict(xs=_with(_recv(), 1, _recv()[1].float()), handles=_handles()), r"'xs\[1\]'"),
    "fp8 rows": (lambda: dict(xs=[r.to(torch.float8_e4m3fn) for r in _recv()], handles=_handles()), r"'xs\[0\]'"),
    "one handle": (lambda: dict(xs=_recv(), handles=_handles()[:1]), "'handles'"),
    "handles swapped": (lambda: dict(xs=_recv(), handles=_handles()[::-1]), r"'handles\[0\]'"),
    "handles of two dispatches": (lambda: dict(xs=_recv(), handles=_other_dispatch_handles()), r"'handles\[1\]'"),
    "weights wrong rows": (lambda: dict(xs=_recv(), handles=_handles(), topk_weights=[W2[1], W2[1]]),
                           r"'topk_weights\[0\]'"),
}


@pytest.mark.parametrize("name", list(COMBINE_CASES))
def test_simulate_combine_bad_input(name):
    build, arg = COMBINE_CASES[name]
    with pytest.raises(pk.ContractError, match=arg):
        pk.simulate_combine(**build())


def _poisoned(value: float, rank: int):
    xs = [x.clone() for x in X2]
    xs[rank][-1, 5] = value
    return xs


LL_DISPATCH_CASES = {
    "NaN with round_scale": (lambda: dict(xs=_poisoned(float("nan"), 1), topk_idx=IDX2,
                                          num_max_dispatch_tokens_per_rank=4, num_experts=4, round_scale=True),
                             r"'xs\[1\]'.*NaN"),
    "Inf with round_scale": (lambda: dict(xs=_poisoned(float("inf"), 0), topk_idx=IDX2,
                                          num_max_dispatch_tokens_per_rank=4, num_experts=4, round_scale=True),
                             r"'xs\[0\]'.*round_scale=False"),
    "fp8 pairs": (lambda: dict(xs=Q2, topk_idx=IDX2, num_max_dispatch_tokens_per_rank=4, num_experts=4),
                  r"'xs\[0\]'"),
    "more tokens than the max": (lambda: dict(xs=X2, topk_idx=IDX2, num_max_dispatch_tokens_per_rank=2,
                                              num_experts=4), r"'xs\[0\]'"),
    "max zero": (lambda: dict(xs=X2, topk_idx=IDX2, num_max_dispatch_tokens_per_rank=0, num_experts=4),
                 "'num_max_dispatch_tokens_per_rank'"),
    "use_fp8 a string": (lambda: dict(xs=X2, topk_idx=IDX2, num_max_dispatch_tokens_per_rank=4, num_experts=4,
                                      use_fp8="yes"), "'use_fp8'"),
    "round_scale an int": (lambda: dict(xs=X2, topk_idx=IDX2, num_max_dispatch_tokens_per_rank=4, num_experts=4,
                                        round_scale=1), "'round_scale'"),
    "fp8 hidden not /128": (lambda: dict(xs=[x[:, :100] for x in X2], topk_idx=IDX2,
                                         num_max_dispatch_tokens_per_rank=4, num_experts=4), r"'xs\[0\]'"),
    "id too large": (lambda: dict(xs=X2, topk_idx=IDX2, num_max_dispatch_tokens_per_rank=4, num_experts=2),
                     r"'topk_idx\[0\]'"),
    "experts not divisible": (lambda: dict(xs=X2, topk_idx=IDX2, num_max_dispatch_tokens_per_rank=4,
                                           num_experts=7), "'num_experts'"),
    "duplicate expert": (lambda: dict(xs=X2, topk_idx=[IDX2[0], torch.tensor([[3, 3], [-1, -1]])],
                                      num_max_dispatch_tokens_per_rank=4, num_experts=4), r"'topk_idx\[1\]'"),
}


@pytest.mark.parametrize("name", list(LL_DISPATCH_CASES))
def test_simulate_low_latency_dispatch_bad_input(name):
    build, arg = LL_DISPATCH_CASES[name]
    with pytest.raises(pk.ContractError, match=arg):
        pk.simulate_low_latency_dispatch(**build())


def _ll(max_tokens=4):
    results = pk.simulate_low_latency_dispatch(X2, IDX2, max_tokens, 4, use_fp8=False)
    return [r.recv_x for r in results], [r.handle for r in results]


def _ll_handles_edited(edit, rank=0):
    xs, handles = _ll()
    handles[rank] = edit(handles[rank])
    return xs, handles


def _swap_across_sources(h):
    """Swap the first slots of two source ranks' ranges (rows stay put): the handle now names
    (token, expert) pairs the routing never sent there."""
    info = h.recv_src_info.clone()
    begin, count = h.range_begin, h.range_count
    e = int(((count > 0).sum(dim=1) == 2).nonzero()[0])
    a, b = int(begin[e, 0]), int(begin[e, 1])
    info[e, a], info[e, b] = h.recv_src_info[e, b], h.recv_src_info[e, a]
    return attrs.evolve(h, recv_src_info=info)


def _src_info_past_max(h):
    info = h.recv_src_info.clone()
    info[0, 0] = h.num_max_dispatch_tokens_per_rank
    return attrs.evolve(h, recv_src_info=info)


def _overlapping_ranges(h):
    return attrs.evolve(h, recv_layout_range=h.recv_layout_range & 0xFFFFFFFF)  # every range begins at slot 0


LL_COMBINE_CASES = {
    "source ranks swapped in a handle": (lambda: dict(xs=_ll()[0], topk_idx=IDX2, topk_weights=W2,
                                                      handles=_ll_handles_edited(_swap_across_sources, rank=1)[1]),
                                         r"'handles(\[1\])?'"),
    "source token past the max": (lambda: dict(xs=_ll()[0], topk_idx=IDX2, topk_weights=W2,
                                               handles=_ll_handles_edited(_src_info_past_max)[1]), r"'handles\[0\]'"),
    "overlapping ranges": (lambda: dict(xs=_ll()[0], topk_idx=IDX2, topk_weights=W2,
                                        handles=_ll_handles_edited(_overlapping_ranges, rank=1)[1]),
                           r"'handles\[1\]'.*overlapping"),
    "deep_ep handle tuples": (lambda: dict(xs=_ll()[0], topk_idx=IDX2, topk_weights=W2,
                                           handles=[tuple(h) for h in _ll()[1]]), r"'handles\[0\]'"),
    "xs wrong shape": (lambda: dict(xs=[x[:, :4] for x in _ll()[0]], topk_idx=IDX2, topk_weights=W2,
                                    handles=_ll()[1]), r"'xs\[0\]'"),
    "xs dtype differs": (lambda: dict(xs=_with(_ll()[0], 1, _ll()[0][1].float()), topk_idx=IDX2, topk_weights=W2,
                                      handles=_ll()[1]), r"'xs\[1\]'"),
    "one xs": (lambda: dict(xs=_ll()[0][:1], topk_idx=IDX2, topk_weights=W2, handles=_ll()[1]), "'xs'"),
    "no weights": (lambda: dict(xs=_ll()[0], topk_idx=IDX2, topk_weights=None, handles=_ll()[1]), "'topk_weights'"),
    "other routing": (lambda: dict(xs=_ll()[0], topk_idx=[IDX2[0], torch.full((2, 2), -1)],
                                   topk_weights=W2, handles=_ll()[1]), "'topk_idx'"),
    "handles of two dispatches": (lambda: dict(xs=_ll()[0], topk_idx=IDX2, topk_weights=W2,
                                               handles=[_ll()[1][0], _ll(5)[1][1]]), r"'handles\[1\]'"),
    "weights fp64": (lambda: dict(xs=_ll()[0], topk_idx=IDX2, topk_weights=[w.double() for w in W2],
                                  handles=_ll()[1]), r"'topk_weights\[0\]'"),
}


@pytest.mark.parametrize("name", list(LL_COMBINE_CASES))
def test_simulate_low_latency_combine_bad_input(name):
    build, arg = LL_COMBINE_CASES[name]
    with pytest.raises(pk.ContractError, match=arg):
        pk.simulate_low_latency_combine(**build())


# ---------------------------------------------------------------------------- registry and conformance

def test_every_ep_op_runs_through_the_registry_with_a_cpu_reference():
    providers = pk.available_backends()["cpu"].providers
    assert all(providers[op] == ("reference",) for op in EP_OPS)


def test_a_backend_without_ep_kernels_reports_them_unsupported(exp_backend):
    with pk.use_backend(exp_backend), pytest.raises(pk.NoKernelError, match="get_dispatch_layout"):
        pk.get_dispatch_layout(IDX2[0], 4, 2)
    report = run_conformance(backend=exp_backend, ops=EP_OPS, quick=True)
    assert report.ok and all(r.passed == 0 and r.unsupported for r in report.ops.values())


def test_quick_conformance_passes_on_cpu():
    report = run_conformance(backend="cpu", ops=EP_OPS, quick=True)
    assert report.ok, report.format_table()
    assert all(r.passed == r.cases > 0 for r in report.ops.values())
