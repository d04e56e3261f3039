"""MoE routing (TileKernels contract): the gate against a per-token loop, exact tie-breaking, bias
for selection only; the fused mapping's layout; expand/reduce bit-exactness and round trips;
bad-input catalogues; the quick conformance run."""

import pytest
import torch

from portable_kernels import (ContractError, FusedMapping, QuantTensor, bf16_gemm_nt, expand_to_fused,
                              expand_to_fused_with_sf, get_fused_mapping, normalize_weight, per_token_cast_to_fp8,
                              reduce_fused, top2_sum_gate, use_backend)
from portable_kernels.layouts import contiguous_m_indices
from portable_kernels.core.numerics import calc_diff
from portable_kernels.testing import CaseFailure, run_conformance
from portable_kernels.testing.generators import randn
from portable_kernels.testing.moe_routing_cases import (check_fused_mapping, check_gate, random_topk_idx,
                                                        reduce_reference64, tied_gate_logits)

OPS = ["top2_sum_gate", "normalize_weight", "get_fused_mapping", "expand_to_fused", "expand_to_fused_with_sf",
       "reduce_fused"]


def loop_gate(logits, bias, k, topk_groups, groups, factor=1.0, normalize=True):
    """The gate written token by token with Python sorting on (-score, index) keys."""
    scores = torch.sigmoid(logits)
    biased = scores if bias is None else scores + bias
    t, e = logits.shape
    idx = torch.empty(t, k, dtype=torch.int64)
    weights = torch.empty(t, k, dtype=torch.float32)
    for tok in range(t):
        s = biased[tok]
        candidates = list(range(e))
        if groups and topk_groups < groups:
            per = e // groups
            group_keys = []
            for g in range(groups):
                best = sorted(s[g * per:(g + 1) * per].tolist(), reverse=True)[:2]
                pair = torch.tensor(best[0], dtype=torch.float32) + torch.tensor(best[1], dtype=torch.float32)
                group_keys.append((-float(pair), g))
            kept = [g for _, g in sorted(group_keys)[:topk_groups]]
            candidates = [x for x in candidates if x // per in kept]
        chosen = [x for _, x in sorted((-float(s[x]), x) for x in candidates)[:k]]
        w = scores[tok, chosen]
        if normalize:
            w = w / (w.sum() + 1e-20)
        idx[tok] = torch.tensor(chosen)
        weights[tok] = w * factor
    return idx, weights


GATE_CONFIGS = [(8, 64, 8, 4, 8, 2.5, True), (5, 32, 4, 1, 4, 1.0, False), (6, 16, 3, 0, 0, 1.0, True),
                (4, 24, 6, 3, 3, 1.0, True)]


@pytest.mark.parametrize("t,e,k,tg,g,factor,normalize", GATE_CONFIGS)
def test_gate_matches_a_per_token_loop(t, e, k, tg, g, factor, normalize):
    logits, bias = randn(t, e, seed=t + e, scale=2.0), randn(e, seed=k, scale=0.2)
    idx, w = top2_sum_gate(logits, bias, k, tg, g, routed_scaling_factor=factor, normalize=normalize)
    want_idx, want_w = loop_gate(logits, bias, k, tg, g, factor, normalize)
    assert torch.equal(idx, want_idx)
    assert calc_diff(w, want_w) < 1e-12
    check_gate(logits, bias, k, tg, g, idx, w, routed_scaling_factor=factor, normalize=normalize)


def test_gate_returns_tilekernels_order_int64_idx_then_fp32_weights():
    idx, w = top2_sum_gate(randn(3, 16, seed=1), None, 2, 2, 4)
    assert idx.dtype == torch.int64 and w.dtype == torch.float32 and idx.shape == w.shape == (3, 2)


def test_all_equal_logits_choose_the_smallest_indices():
    idx, w = top2_sum_gate(torch.zeros(2, 16) + 0.3, None, 5, 2, 4)
    assert idx.tolist() == [[0, 1, 2, 3, 4]] * 2
    assert torch.allclose(w, torch.full((2, 5), 0.2))


def test_tied_groups_keep_the_smaller_group_and_tied_experts_the_smaller_index():
    logits, bias = tied_gate_logits(5, 32, 8, seed=2)
    idx, _ = top2_sum_gate(logits, bias, 4, 2, 8)
    want, _ = loop_gate(logits, bias, 4, 2, 8)
    assert torch.equal(idx, want)
    assert bool((idx < 8).all())  # identical groups: groups 0 and 1 (4 experts each) win the tie


def test_bias_changes_the_selection_but_not_the_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    idx_plain, w_plain = top2_sum_gate(logits, None, 2, 0, 0, normalize=False)
    idx_biased, w_biased = top2_sum_gate(logits, bias, 2, 0, 0, normalize=False)
    assert idx_plain.tolist() == [[0, 1]] and idx_biased.tolist() == [[3, 0]]
    assert torch.equal(w_biased, torch.sigmoid(logits)[0, [3, 0]][None])
    assert torch.equal(w_plain, torch.sigmoid(logits)[0, [0, 1]][None])


def test_bias_decides_the_groups_through_the_top2_sums():
    logits = torch.zeros(1, 8)
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.1])
    idx, _ = top2_sum_gate(logits, bias, 2, 1, 4)
    assert idx.tolist() == [[4, 5]]  # groups 2 and 3 tie on top-2 sums; group 2 (smaller) is kept


def test_normalized_weights_sum_to_the_scaling_factor():
    _, w = top2_sum_gate(randn(20, 64, seed=3), randn(64, seed=4, scale=0.1), 8, 4, 8, routed_scaling_factor=2.5)
    assert torch.allclose(w.sum(1), torch.full((20,), 2.5))


def test_unnormalized_weights_are_the_scaled_sigmoid_scores():
    logits = randn(6, 16, seed=5)
    idx, w = top2_sum_gate(logits, None, 3, 0, 0, routed_scaling_factor=2.0, normalize=False)
    assert torch.equal(w, torch.sigmoid(logits).gather(1, idx) * 2.0)


def test_sqrtsoftplus_scoring_passes_the_property_check():
    logits, bias = randn(9, 32, seed=6), randn(32, seed=7, scale=0.1)
    idx, w = top2_sum_gate(logits, bias, 4, 2, 4, scoring_func="sqrtsoftplus")
    check_gate(logits, bias, 4, 2, 4, idx, w, scoring_func="sqrtsoftplus")


def test_masked_tokens_get_minus_one_and_zero_weight():
    mask = torch.tensor([True, False, True])
    idx, w = top2_sum_gate(randn(3, 16, seed=8), None, 2, 2, 4, mask=mask)
    assert idx[1].tolist() == [-1, -1] and w[1].tolist() == [0.0, 0.0]
    assert bool((idx[[0, 2]] >= 0).all())


def test_keeping_every_group_equals_no_grouping():
    logits, bias = randn(7, 32, seed=9), randn(32, seed=10, scale=0.1)
    assert torch.equal(top2_sum_gate(logits, bias, 4, 4, 4)[0], top2_sum_gate(logits, bias, 4, 0, 0)[0])


def test_gate_checker_rejects_a_chosen_expert_outside_the_kept_groups():
    logits, bias = randn(4, 32, seed=11, scale=2.0), None
    idx, w = top2_sum_gate(logits, bias, 4, 1, 8)
    group = idx[0, 0] // 4
    idx[0, 3] = int(((group + 4) % 8) * 4)  # an expert of a far group
    with pytest.raises(CaseFailure):
        check_gate(logits, bias, 4, 1, 8, idx, w)


def test_gate_checker_rejects_a_worse_expert():
    logits = randn(4, 16, seed=12, scale=2.0)
    idx, w = top2_sum_gate(logits, None, 2, 0, 0)
    worst = int(logits[0].argmin())
    idx[0, 1] = worst
    with pytest.raises(CaseFailure):
        check_gate(logits, None, 2, 0, 0, idx, w)


# -- normalize_weight ---------------------------------------------------------------------------

def test_normalize_weight_returns_denominator_and_rows_summing_to_one():
    w = randn(10, 8, seed=13).abs()
    denominator, normalized = normalize_weight(w)
    assert torch.allclose(denominator, w.sum(1)) and torch.allclose(normalized.sum(1), torch.ones(10))
    assert torch.allclose(normalized * denominator[:, None], w)


# -- get_fused_mapping --------------------------------------------------------------------------

def test_mapping_hand_example_matches_the_grouped_gemm_layout():
    idx = torch.tensor([[2, 0], [2, -1], [0, 2]])
    m = get_fused_mapping(idx, 3, 0, 4)
    assert m.pos_to_expert.tolist() == [0, 0, -1, -1, 2, 2, 2, -1]
    assert m.pos_to_expert.tolist() == contiguous_m_indices(torch.tensor([2, 0, 3]), 4).tolist()
    assert m.token_topk_to_pos.tolist() == [[4, 0], [5, -1], [1, 6]]
    assert m.pos_to_token.tolist() == [0, 2, -1, -1, 0, 1, 2, -1]
    assert m.pos_to_token_topk.tolist() == [1, 4, -1, -1, 0, 2, 5, -1]
    assert m.expert_start.tolist() == [0, 4, 4] and m.expert_end.tolist() == [4, 4, 8]
    assert m.num_tokens_per_expert.tolist() == [4, 0, 4] == m.num_tokens_per_expert_list


def test_mapping_unpacks_as_the_tilekernels_eight_tuple():
    m = get_fused_mapping(random_topk_idx(5, 2, 4, seed=14), 4, 0, 8)
    assert isinstance(m, FusedMapping) and len(tuple(m)) == 8
    (pos_to_expert, _, _, token_topk_to_pos, _, _, per_expert, listed) = m
    assert pos_to_expert is m.pos_to_expert and listed == per_expert.tolist()


@pytest.mark.parametrize("alignment", [1, 8, 128])
def test_every_segment_starts_on_the_alignment(alignment):
    idx = random_topk_idx(40, 6, 16, seed=15, padding=0.2)
    m = get_fused_mapping(idx, 16, 0, alignment)
    assert bool((m.expert_start % alignment == 0).all()) and bool((m.num_tokens_per_expert % alignment == 0).all())
    check_fused_mapping(idx, 16, alignment, m)


def test_negative_indices_are_padding_and_map_nowhere():
    idx = torch.tensor([[-1, -5], [1, -1]])
    m = get_fused_mapping(idx, 2, 0, 4)
    assert m.token_topk_to_pos.tolist() == [[-1, -1], [0, -1]]
    assert int((m.pos_to_expert >= 0).sum()) == 1


@pytest.mark.parametrize("backend,alignment", [("cpu", 128), ("nvidia", 128), ("ascend", 256)])
def test_default_alignment_is_the_backends_grouped_gemm_alignment(backend, alignment):
    idx = random_topk_idx(6, 2, 4, seed=16)
    with use_backend(backend):
        m = get_fused_mapping(idx, 4)
    check_fused_mapping(idx, 4, alignment, m)


def test_explicit_size_pads_with_minus_one_and_too_small_is_refused():
    idx = torch.tensor([[0, 1], [1, 0]])
    m = get_fused_mapping(idx, 2, 20, 4)
    assert m.pos_to_expert.numel() == 20 and m.pos_to_expert[8:].tolist() == [-1] * 12
    assert m.num_tokens_per_expert_list == []
    with pytest.raises(ContractError, match="'num_expanded_tokens'"):
        get_fused_mapping(idx, 2, 7, 4)


def test_force_no_sync_uses_the_upper_bound():
    idx = random_topk_idx(9, 3, 5, seed=17)
    m = get_fused_mapping(idx, 5, 0, 8, force_no_sync=True)
    assert m.pos_to_expert.numel() == -(-(9 * 3 + 7 * 5) // 8) * 8 and m.num_tokens_per_expert_list == []
    check_fused_mapping(idx, 5, 8, m)


def test_int32_topk_idx_is_accepted():
    idx = random_topk_idx(8, 2, 4, seed=18)
    assert torch.equal(get_fused_mapping(idx.int(), 4, 0, 4).token_topk_to_pos,
                       get_fused_mapping(idx, 4, 0, 4).token_topk_to_pos)


def test_mapping_checker_rejects_a_swapped_row():
    idx = torch.tensor([[0, 1], [1, 0]])
    m = get_fused_mapping(idx, 2, 0, 4)
    bad = m.token_topk_to_pos.clone()
    bad[0, 0], bad[0, 1] = bad[0, 1].clone(), bad[0, 0].clone()
    with pytest.raises(CaseFailure):
        check_fused_mapping(idx, 2, 4, m._replace(token_topk_to_pos=bad))


# -- expand / reduce ----------------------------------------------------------------------------

def _mapping(t=12, k=4, e=8, alignment=8, seed=19):
    idx = random_topk_idx(t, k, e, seed=seed, padding=0.15)
    return idx, get_fused_mapping(idx, e, 0, alignment)


def test_expand_copies_tokens_bit_for_bit_and_zeroes_padding_rows():
    idx, m = _mapping()
    x = randn(12, 32, seed=20, dtype=torch.bfloat16)
    out = expand_to_fused(x, m.token_topk_to_pos, m.pos_to_expert)
    rows = m.pos_to_token.long()
    assert torch.equal(out[rows >= 0].view(torch.int16), x[rows[rows >= 0]].view(torch.int16))
    assert bool((out[rows < 0] == 0).all())


def test_expand_accepts_the_mapping_itself_and_any_dtype():
    _, m = _mapping()
    x = randn(12, 16, seed=21).to(torch.float8_e4m3fn)
    a = expand_to_fused(x, m)
    b = expand_to_fused(x, m.token_topk_to_pos, m.pos_to_expert)
    assert a.dtype == torch.float8_e4m3fn and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("col_major", [False, True])
def test_expand_with_sf_copies_fp8_rows_and_their_scales(col_major):
    _, m = _mapping(t=7, k=3, e=6, alignment=4)
    q = per_token_cast_to_fp8(randn(7, 256, seed=22, dtype=torch.bfloat16))
    out = expand_to_fused_with_sf(q, 128, m, use_tma_aligned_col_major_sf=col_major)
    assert isinstance(out, QuantTensor) and out.granularity == (1, 128)
    data, sf = out
    rows = m.pos_to_token.long()
    assert torch.equal(data[rows >= 0].view(torch.uint8), q.data[rows[rows >= 0]].view(torch.uint8))
    assert torch.equal(sf[rows >= 0], q.scale[rows[rows >= 0]]) and bool((sf[rows < 0] == 0).all())
    p = rows.numel()
    assert sf.stride() == ((1, -(-p // 4) * 4) if col_major else (2, 1))


def test_expand_then_scaled_identity_per_expert_then_reduce_is_the_weighted_sum():
    idx, m = _mapping(t=10, k=4, e=8, alignment=8, seed=23)
    x = randn(10, 64, seed=24)
    w = randn(10, 4, seed=25).abs()
    expanded = expand_to_fused(x, m)
    y = expanded * (m.pos_to_expert.float() + 1.0)[:, None]  # expert e multiplies by (e + 1)
    out = reduce_fused(y, w, m)
    factor = torch.where(idx >= 0, w * (idx.float() + 1.0), 0.0).sum(1)
    assert calc_diff(out, factor[:, None] * x) < 1e-12


def test_round_trip_through_an_identity_gemm():
    idx, m = _mapping(t=9, k=3, e=4, alignment=4, seed=26)
    x = randn(9, 32, seed=27, dtype=torch.bfloat16)
    w = randn(9, 3, seed=28).abs()
    expanded = expand_to_fused(x, m)
    d = torch.full((expanded.shape[0], 32), float("nan"))
    bf16_gemm_nt(expanded, torch.eye(32, dtype=torch.bfloat16), d)
    out = reduce_fused(d, w, m)
    want = torch.where(idx >= 0, w, 0.0).sum(1, keepdim=True) * x.float()
    assert calc_diff(out, want) < 1e-12


def test_round_trip_through_the_contiguous_grouped_gemm():
    grouped = pytest.importorskip("portable_kernels.ops.gemm.grouped")
    idx = random_topk_idx(20, 4, 6, seed=29, padding=0.1)
    m = get_fused_mapping(idx, 6)  # the backend's alignment, as the grouped GEMM wants
    x = randn(20, 64, seed=30, dtype=torch.bfloat16)
    scale = torch.arange(1, 7, dtype=torch.float32)
    b = (torch.eye(64)[None] * scale[:, None, None]).to(torch.bfloat16)  # expert e: (e + 1)·I
    d = torch.full((m.pos_to_expert.numel(), 64), float("nan"))  # padding rows stay NaN, never read
    grouped.m_grouped_bf16_gemm_nt_contiguous(expand_to_fused(x, m), b, d, m.pos_to_expert)
    w = randn(20, 4, seed=31).abs()
    out = reduce_fused(d, w, m)
    factor = torch.where(idx >= 0, w * (idx.float() + 1.0), 0.0).sum(1)
    assert calc_diff(out, factor[:, None] * x.float()) < 1e-12


def test_reduce_never_reads_padding_rows_and_accumulates_in_fp32():
    idx, m = _mapping(seed=32)
    y = randn(m.pos_to_expert.numel(), 48, seed=33)
    y[m.pos_to_expert < 0] = float("nan")
    w = randn(12, 4, seed=34)
    out = reduce_fused(y.to(torch.bfloat16), w, m)
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(out).all())
    assert calc_diff(out, reduce_reference64(y.to(torch.bfloat16), w, m.token_topk_to_pos)) < 1e-5


def test_reduce_without_weights_is_the_plain_sum_and_x_sf_scales_rows():
    idx, m = _mapping(seed=35)
    y = randn(m.pos_to_expert.numel(), 16, seed=36)
    y_sf = randn(m.pos_to_expert.numel(), seed=37).abs()
    assert calc_diff(reduce_fused(y, None, m), reduce_reference64(y, None, m.token_topk_to_pos)) < 1e-12
    assert calc_diff(reduce_fused((y, y_sf), None, m), reduce_reference64(y, None, m.token_topk_to_pos, y_sf)) < 1e-12


def test_reduce_to_fp8_scales_clamps_and_writes_into_out():
    idx, m = _mapping(seed=38)
    y = randn(m.pos_to_expert.numel(), 16, seed=39, scale=400.0)
    out = torch.empty(12, 16, dtype=torch.float8_e4m3fn)
    got = reduce_fused(y, None, m, fp8_format="e4m3", sf=torch.tensor([0.5]), out=out)
    assert got is out
    want = (reduce_reference64(y, None, m.token_topk_to_pos) * 0.5).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))


# -- bad inputs ---------------------------------------------------------------------------------

LOGITS, BIAS = randn(4, 16, seed=40), randn(16, seed=41)
GATE_OK = dict(logits=LOGITS, bias=BIAS, num_topk=2, num_topk_groups=2, num_groups=4)
GATE_BAD = [
    ("logits", dict(logits=LOGITS.to(torch.bfloat16))),
    ("logits", dict(logits=LOGITS[0])),
    ("logits", dict(logits=torch.empty(4, 0))),
    ("logits", dict(logits=torch.where(LOGITS > 1, float("nan"), LOGITS))),
    ("logits", dict(logits=torch.where(LOGITS > 1, float("inf"), LOGITS))),
    ("bias", dict(bias=BIAS[:8])),
    ("bias", dict(bias=BIAS.double())),
    ("bias", dict(bias=BIAS.to("meta"))),
    ("bias", dict(bias=torch.full((16,), float("nan")))),
    ("num_topk", dict(num_topk=0)),
    ("num_topk", dict(num_topk=9)),
    ("num_topk", dict(num_topk=2.0)),
    ("num_topk_groups", dict(num_topk_groups=0)),
    ("num_topk_groups", dict(num_topk_groups=5)),
    ("num_groups", dict(num_groups=3, num_topk_groups=1)),
    ("num_groups", dict(num_groups=-1)),
    ("num_shared_experts", dict(use_shared_as_routed=True)),
    ("use_shared_as_routed", dict(use_shared_as_routed=True, num_shared_experts=1)),  # no replica room
    ("use_shared_as_routed", dict(use_shared_as_routed=1)),
    ("num_shared_experts", dict(num_shared_experts=-1)),
    ("routed_scaling_factor", dict(routed_scaling_factor=float("inf"))),
    ("routed_scaling_factor", dict(routed_scaling_factor="2.5")),
    ("ep_rank", dict(ep_rank=1)),
    ("num_tp_ranks", dict(num_tp_ranks=0)),
    ("tp_rank", dict(num_tp_ranks=2, tp_rank=2)),
    ("num_ep_ranks", dict(num_ep_ranks=3, num_tp_ranks=2)),  # 16 experts on 3 ranks
    ("scoring_func", dict(scoring_func="identity")),
    ("logical_count", dict(to_physical_map=torch.zeros(16, 2, dtype=torch.int32))),
    ("to_physical_map", dict(to_physical_map=torch.zeros(15, 2, dtype=torch.int32),
                             logical_count=torch.ones(15, dtype=torch.int32))),
    ("unmapped_topk_idx", dict(fix_routing_mask=torch.ones(4, dtype=torch.bool))),
    ("unmapped_topk_idx", dict(unmapped_topk_idx=torch.zeros(4, 3, dtype=torch.int64))),
    ("unmapped_topk_idx", dict(fix_routing_mask=torch.ones(4, dtype=torch.bool),
                               unmapped_topk_idx=torch.full((4, 2), 16, dtype=torch.int64))),
    ("fix_routing_mask", dict(fix_routing_mask=torch.ones(4), unmapped_topk_idx=torch.zeros(4, 2, dtype=torch.int64))),
    ("mask", dict(mask=torch.ones(3, dtype=torch.bool))),
    ("mask", dict(mask=torch.ones(4))),
    ("normalize", dict(normalize=1)),
]


@pytest.mark.parametrize("arg,change", GATE_BAD, ids=[f"{a}-{i}" for i, (a, _) in enumerate(GATE_BAD)])
def test_gate_bad_input_names_the_argument(arg, change):
    with pytest.raises(ContractError, match=f"argument '{arg}'"):
        top2_sum_gate(**{**GATE_OK, **change})


IDX = torch.tensor([[0, 1], [2, -1]])
MAP_BAD = [
    ("topk_idx", dict(topk_idx=IDX.float())),
    ("topk_idx", dict(topk_idx=IDX[0])),
    ("topk_idx", dict(topk_idx=torch.tensor([[0, 4]]))),
    ("num_experts", dict(num_experts=0)),
    ("num_experts", dict(num_experts=True)),
    ("num_expanded_tokens", dict(num_expanded_tokens=-1)),
    ("num_expanded_tokens", dict(num_expanded_tokens=5)),
    ("alignment", dict(alignment=0)),
    ("force_no_sync", dict(force_no_sync="no")),
]


@pytest.mark.parametrize("arg,change", MAP_BAD, ids=[f"{a}-{i}" for i, (a, _) in enumerate(MAP_BAD)])
def test_mapping_bad_input_names_the_argument(arg, change):
    with pytest.raises(ContractError, match=f"argument '{arg}'"):
        get_fused_mapping(**{**dict(topk_idx=IDX, num_experts=4, alignment=4), **change})


_, M = _mapping(t=3, k=2, e=4, alignment=4, seed=42)
XE = randn(3, 8, seed=43)
TTP = M.token_topk_to_pos
EXPAND_BAD = [
    ("x", dict(x=XE[0])),
    ("x", dict(x="x")),
    ("token_topk_to_pos", dict(token_topk_to_pos=TTP.float())),
    ("token_topk_to_pos", dict(token_topk_to_pos=TTP[:2])),
    ("token_topk_to_pos", dict(token_topk_to_pos=TTP.to("meta"))),
    ("token_topk_to_pos", dict(token_topk_to_pos=torch.full_like(TTP, 10**6))),
    ("token_topk_to_pos", dict(token_topk_to_pos=torch.zeros_like(TTP))),
    ("pos_to_expert", dict(pos_to_expert=None)),
    ("pos_to_expert", dict(pos_to_expert=M.pos_to_expert[None])),
    ("token_topk_to_pos", dict(pos_to_expert=torch.full_like(M.pos_to_expert, -1))),  # names the pair
]


@pytest.mark.parametrize("arg,change", EXPAND_BAD, ids=[f"{a}-{i}" for i, (a, _) in enumerate(EXPAND_BAD)])
def test_expand_bad_input_names_the_argument(arg, change):
    kwargs = {**dict(x=XE, token_topk_to_pos=TTP, pos_to_expert=M.pos_to_expert), **change}
    with pytest.raises(ContractError, match=f"argument '{arg}'"):
        expand_to_fused(**kwargs)


Q = per_token_cast_to_fp8(randn(3, 256, seed=44))
SF_BAD = [
    ("x", dict(x=randn(3, 256, seed=45))),
    ("x", dict(x=(Q.data.float(), Q.scale))),
    ("x", dict(x=(Q.data, Q.scale[:, :1]))),
    ("x", dict(x=(Q.data, Q.scale.double()))),
    ("x", dict(x=Q, num_per_channels=64)),
    ("num_per_channels", dict(num_per_channels=0)),
    ("use_tma_aligned_col_major_sf", dict(use_tma_aligned_col_major_sf=None)),
    ("pos_to_expert", dict(token_topk_to_pos=M, pos_to_expert=M.pos_to_expert)),
]


@pytest.mark.parametrize("arg,change", SF_BAD, ids=[f"{a}-{i}" for i, (a, _) in enumerate(SF_BAD)])
def test_expand_with_sf_bad_input_names_the_argument(arg, change):
    kwargs = {**dict(x=Q, num_per_channels=128, token_topk_to_pos=TTP, pos_to_expert=M.pos_to_expert), **change}
    with pytest.raises(ContractError, match=f"argument '{arg}'"):
        expand_to_fused_with_sf(**kwargs)


Y = randn(M.pos_to_expert.numel(), 8, seed=46)
W = randn(3, 2, seed=47)
REDUCE_BAD = [
    ("x", dict(x=Y.half())),
    ("x", dict(x=Y[0])),
    ("x", dict(x=(Y, Y[:, 0], Y))),
    ("x_sf", dict(x=(Y, Y[:2, 0]))),
    ("topk_weights", dict(topk_weights=W.double())),
    ("topk_weights", dict(topk_weights=W[:, :1])),
    ("token_topk_to_pos", dict(token_topk_to_pos=TTP.float())),
    ("token_topk_to_pos", dict(token_topk_to_pos=torch.full_like(TTP, 10**6))),
    ("fp8_format", dict(fp8_format="e5m2")),
    ("sf", dict(sf=torch.tensor([0.5]))),
    ("sf", dict(fp8_format="e4m3", sf=torch.tensor([0.5, 0.5]))),
    ("out", dict(out=torch.empty(3, 8, dtype=torch.bfloat16))),
    ("out", dict(out=torch.empty(8, 3).T)),
    ("out", dict(out=torch.empty(2, 8))),
]


@pytest.mark.parametrize("arg,change", REDUCE_BAD, ids=[f"{a}-{i}" for i, (a, _) in enumerate(REDUCE_BAD)])
def test_reduce_bad_input_names_the_argument(arg, change):
    kwargs = {**dict(x=Y, topk_weights=W, token_topk_to_pos=TTP), **change}
    with pytest.raises(ContractError, match=f"argument '{arg}'"):
        reduce_fused(**kwargs)


@pytest.mark.parametrize("bad", [W.double(), W[0], "w"])
def test_normalize_weight_bad_input_names_the_argument(bad):
    with pytest.raises(ContractError, match="argument 'topk_weights'"):
        normalize_weight(bad)


def test_quick_conformance_passes_on_cpu():
    report = run_conformance(backend="cpu", ops=OPS, quick=True)
    assert report.ok, report.format_table()
