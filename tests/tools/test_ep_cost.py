"""The EP cost model (portable_kernels.tools.ep_cost): its byte counts are the ones get_dispatch_layout's
routing implies and the ones the distributed Buffer really sends; time behaves (more bandwidth,
less time; more tokens, more bytes); FP8 vs bf16; the DeepEP intranode preset lands near the
published figure; the CLI and its plot."""

from __future__ import annotations

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from portable_kernels.__main__ import main
from portable_kernels.ops.ep import get_dispatch_layout
from portable_kernels.tools.ep_cost import (BUFFER_EXCHANGE, FP8_FACTOR, GB, PRESETS, PUBLISHED, ROWS_ONLY, US,
                                      Fabric, MoEShape, RoutingSpec, Tier, call_traffic, estimate, header_bytes,
                                      layer_counts, parse_tier, row_counts)
from portable_kernels.tools.ep_cost import routing as routing_module
from portable_kernels.tools.ep_cost.report import check_published
from portable_kernels.core.errors import ContractError
from portable_kernels.testing.ep_cases import random_routing
from portable_kernels.testing.ep_cost_wire import count_buffer_bytes
from portable_kernels.testing.ep_distributed import run_ranks

SMALL = MoEShape(hidden=256, num_topk=4, num_experts=32, tokens_per_rank=64, payload="fp8")
TWO_TIER = Fabric("test-two-tier", (Tier("inner", 4, 100 * GB, 1 * US), Tier("outer", None, 10 * GB, 2 * US, hops=3)))


def _expected_rows(ids: list[torch.Tensor], num_experts: int) -> torch.Tensor:
    """rows[s][d] counted by hand: tokens of s with at least one expert owned by d."""
    num_ranks = len(ids)
    per_rank = num_experts // num_ranks
    rows = torch.zeros(num_ranks, num_ranks, dtype=torch.int64)
    for s, idx in enumerate(ids):
        for token in idx.tolist():
            for d in {e // per_rank for e in token if e >= 0}:
                rows[s, d] += 1
    return rows


routings = st.tuples(st.sampled_from([1, 2, 3, 4, 6, 8]), st.integers(1, 4), st.integers(1, 6), st.integers(1, 40),
                     st.integers(0, 10_000))


@settings(max_examples=30, deadline=None)
@given(routings)
def test_row_counts_are_what_get_dispatch_layout_implies_on_random_routing(params):
    num_ranks, experts_per_rank, topk, tokens, seed = params
    num_experts = num_ranks * experts_per_rank
    topk = min(topk, num_experts)
    # random_routing drops entries (-1) and routes its last token nowhere: the edge cases come for free
    ids = [random_routing(tokens + r % 2, topk, num_experts, seed=seed + r) for r in range(num_ranks)]
    counts = row_counts(ids, num_experts)
    assert torch.equal(counts.rows, _expected_rows(ids, num_experts))
    for s, idx in enumerate(ids):
        per_rank, _, _, in_rank = get_dispatch_layout(idx, num_experts, num_ranks)
        assert torch.equal(counts.rows[s], per_rank.long())
        assert counts.rows[s].sum() == in_rank.sum()
    assert torch.equal(counts.expert_tokens, torch.bincount(torch.cat(ids).flatten().clamp(min=0)[
        torch.cat(ids).flatten() >= 0], minlength=num_experts))


@settings(max_examples=30, deadline=None)
@given(routings, st.sampled_from(["fp8", "bf16"]), st.sampled_from([BUFFER_EXCHANGE, ROWS_ONLY]))
def test_traffic_bytes_follow_the_row_counts(params, payload, exchange):
    num_ranks, experts_per_rank, topk, tokens, seed = params
    shape = MoEShape(256, min(topk, num_ranks * experts_per_rank), num_ranks * experts_per_rank, tokens, payload)
    counts = layer_counts(shape, num_ranks, RoutingSpec(seed=seed))
    rows = counts.rows.double()
    off = rows * (1 - torch.eye(num_ranks, dtype=torch.float64))
    dispatch = call_traffic("dispatch", shape, counts, TWO_TIER, exchange)
    combine = call_traffic("combine", shape, counts, TWO_TIER, exchange)
    # every byte sent is received; nothing a rank keeps is on the fabric
    for call in (dispatch, combine):
        assert torch.allclose(call.send.sum(dim=0), call.recv.sum(dim=0))
        assert torch.allclose(call.peer.diagonal(), call.local)
    assert torch.allclose(dispatch.send.sum(dim=1), off.sum(dim=1) * dispatch.row_bytes)
    assert torch.allclose(dispatch.recv.sum(dim=1), off.sum(dim=0) * dispatch.row_bytes)
    # the combine returns exactly the rows the dispatch delivered, as bf16
    assert torch.allclose(combine.send.sum(dim=1), off.sum(dim=0) * combine.row_bytes)
    assert combine.token_row_bytes == 2 * shape.hidden
    # DeepEP counts every received row, the own ones too
    assert torch.allclose(dispatch.counted, rows.sum(dim=0) * shape.dispatch_row_bytes)
    # the header goes to every peer once per call, split by tier
    expected_header = (num_ranks - 1) * header_bytes(num_ranks) if exchange.header else 0
    assert torch.allclose(dispatch.header_send.sum(dim=1), torch.full((num_ranks,), float(expected_header), dtype=torch.float64))


def test_row_counts_chunking_does_not_change_the_counts(monkeypatch):
    ids = [random_routing(30 + (r == 3), 3, 24, seed=70 + r) for r in range(6)]  # rank 3 has another token count
    whole = row_counts(ids, 24)
    monkeypatch.setattr(routing_module, "LAYOUT_CHUNK_ELEMENTS", 30 * 6 * 2)  # two ranks per layout call
    chunked = row_counts(ids, 24)
    assert torch.equal(whole.rows, chunked.rows) and torch.equal(whole.expert_tokens, chunked.expert_tokens)


@pytest.mark.parametrize("fp8", [True, False])
def test_bytes_equal_what_the_buffer_hands_its_transport(fp8):
    """Three Gloo ranks (so a middle rank, whose own block travels inside the collective, is
    covered): per peer, the model's payload and header bytes are the bytes the Buffer sent."""
    cfg = dict(tokens=48, hidden=256, topk=4, experts=12, fp8=fp8, seed=40)
    outcomes = run_ranks(3, count_buffer_bytes, (cfg,), timeout_s=150)
    assert all(o.ok for o in outcomes), [o.describe() for o in outcomes]
    ids = [o.value["topk_idx"] for o in outcomes]
    shape = MoEShape(cfg["hidden"], cfg["topk"], cfg["experts"], cfg["tokens"], "fp8" if fp8 else "bf16")
    counts = layer_counts(shape, 3, ids)
    for kind, op in (("dispatch", "Buffer.dispatch"), ("combine", "Buffer.combine")):
        traffic = call_traffic(kind, shape, counts, PRESETS["ubl128"], BUFFER_EXCHANGE)
        for rank, outcome in enumerate(outcomes):
            sent = [s for s in outcome.value["sent"] if s[0] == op]
            payload = [sum(s[2][d] for s in sent if s[1] != "header exchange") for d in range(3)]
            headers = [s[2] for s in sent if s[1] == "header exchange"]
            assert len(headers) == 1 and headers[0] == [traffic.header_peer] * 3
            for d in range(3):
                if d != rank:
                    assert payload[d] == traffic.peer[rank, d], (kind, rank, d)


def test_fp8_dispatch_moves_bf16_bytes_times_the_deepep_factor():
    counts = layer_counts(SMALL, 4, RoutingSpec(seed=3))
    fp8 = call_traffic("dispatch", SMALL, counts, TWO_TIER, ROWS_ONLY)
    bf16 = call_traffic("dispatch", attrs.evolve(SMALL, payload="bf16"), counts, TWO_TIER, ROWS_ONLY)
    assert FP8_FACTOR == (1 + 4 / 128) / 2
    assert torch.allclose(fp8.send, bf16.send * FP8_FACTOR)
    assert torch.allclose(fp8.counted, bf16.counted * FP8_FACTOR)
    # the combine returns bf16 rows whatever the dispatch payload
    assert torch.equal(call_traffic("combine", SMALL, counts, TWO_TIER, ROWS_ONLY).send,
                       call_traffic("combine", attrs.evolve(SMALL, payload="bf16"), counts, TWO_TIER, ROWS_ONLY).send)


def _with_bandwidth(fabric: Fabric, tier: int, factor: float) -> Fabric:
    tiers = list(fabric.tiers)
    tiers[tier] = attrs.evolve(tiers[tier], bandwidth=tiers[tier].bandwidth * factor)
    return attrs.evolve(fabric, tiers=tuple(tiers))


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([0, 1]), st.floats(1.0, 100.0), st.sampled_from([1, 16, 1024]), st.integers(0, 100))
def test_more_bandwidth_never_costs_more_time(tier, factor, tokens, seed):
    shape = attrs.evolve(SMALL, tokens_per_rank=tokens)
    counts = layer_counts(shape, 8, RoutingSpec(seed=seed))
    base = estimate(shape, TWO_TIER, 8, counts=counts)
    faster = estimate(shape, _with_bandwidth(TWO_TIER, tier, factor), 8, counts=counts)
    assert faster.seconds <= base.seconds


def test_the_binding_tier_speeds_the_layer_up():
    shape = attrs.evolve(SMALL, tokens_per_rank=1024)
    counts = layer_counts(shape, 8, RoutingSpec(seed=4))
    base = estimate(shape, TWO_TIER, 8, counts=counts)
    # the outer tier is 10x slower and carries half the peers: it binds, so quadrupling it shows
    assert base.dispatch.phases[-1].bound == "outer bandwidth"
    assert estimate(shape, _with_bandwidth(TWO_TIER, 1, 4.0), 8, counts=counts).seconds < 0.5 * base.seconds
    # the inner tier does not bind: making it faster changes nothing
    assert estimate(shape, _with_bandwidth(TWO_TIER, 0, 4.0), 8, counts=counts).seconds == base.seconds


def test_more_tokens_move_more_bytes_and_take_longer():
    small = estimate(SMALL, TWO_TIER, 8, RoutingSpec(seed=5))
    large = estimate(attrs.evolve(SMALL, tokens_per_rank=4 * SMALL.tokens_per_rank), TWO_TIER, 8, RoutingSpec(seed=5))
    for kind in ("dispatch", "combine"):
        assert large.call(kind).traffic.send.sum() > small.call(kind).traffic.send.sum()
    assert large.seconds > small.seconds


def test_header_and_metadata_only_add_bytes_and_time():
    counts = layer_counts(SMALL, 8, RoutingSpec(seed=6))
    rows = estimate(SMALL, TWO_TIER, 8, exchange=ROWS_ONLY, counts=counts)
    buffer = estimate(SMALL, TWO_TIER, 8, exchange=BUFFER_EXCHANGE, counts=counts)
    assert buffer.seconds > rows.seconds
    assert (buffer.dispatch.traffic.send >= rows.dispatch.traffic.send).all()
    assert [p.name for p in buffer.dispatch.phases] == ["header", "payload"]
    assert [p.name for p in rows.dispatch.phases] == ["payload"]


def test_a_tiny_exchange_is_bound_by_latency_and_a_large_one_by_bandwidth():
    tiny = estimate(attrs.evolve(SMALL, tokens_per_rank=1), TWO_TIER, 8, RoutingSpec(seed=7))
    large = estimate(attrs.evolve(SMALL, tokens_per_rank=4096), TWO_TIER, 8, RoutingSpec(seed=7))
    assert tiny.dispatch.phases[-1].bound == "latency"
    assert large.dispatch.phases[-1].bound.endswith("bandwidth")
    # the header phase is one round of the farthest tier's latency: 3 hops x 2 us
    assert tiny.dispatch.phases[0].latency == pytest.approx(6 * US)


def test_an_aggregate_limit_binds_when_many_ranks_share_it():
    shared = Fabric("shared", (Tier("cpu", None, 10 * GB, 0.0, hops=0, aggregate_bandwidth=20 * GB),))
    two = estimate(SMALL, shared, 2, RoutingSpec(seed=8))
    eight = estimate(SMALL, shared, 8, RoutingSpec(seed=8))
    assert two.dispatch.phases[-1].bound == "cpu bandwidth"
    assert eight.dispatch.phases[-1].bound == "cpu aggregate bandwidth"


def test_tiers_nest_and_place_ranks_contiguously():
    tiers = TWO_TIER.tier_matrix(8)
    assert tiers[0, 3] == 0 and tiers[3, 4] == 1 and tiers[5, 7] == 0 and tiers[2, 2] == -1
    pod = PRESETS["ub-pod-256k"].tier_matrix(256)
    assert pod[0, 127] == 0 and pod[0, 128] == 1
    with pytest.raises(ContractError, match="EP degree"):
        PRESETS["ubl128"].tier_matrix(256)
    with pytest.raises(ContractError, match="multiple of the inner tier"):
        Fabric("bad", (Tier("a", 8, GB, 0.0), Tier("b", 12, GB, 0.0)))
    with pytest.raises(ContractError, match="bandwidth"):
        Tier("a", 8, 0.0, 0.0)


def test_skew_and_group_limits_shape_the_routing():
    shape = MoEShape(256, 4, 64, 512, "bf16")
    uniform = layer_counts(shape, 8, RoutingSpec(seed=9))
    skewed = layer_counts(shape, 8, RoutingSpec(seed=9, skew=1.2))
    assert skewed.expert_imbalance > 2 * uniform.expert_imbalance
    grouped = RoutingSpec(seed=9, groups=8, topk_groups=2).topk_idx(shape, 2)
    for ids in grouped:
        assert (ids // 8).unique(dim=None).numel() <= 8
        assert all(len(set(row)) <= 2 for row in (ids // 8).tolist())
        assert all(len(set(row)) == 4 for row in ids.tolist())
    with pytest.raises(ContractError, match="topk_groups"):
        RoutingSpec(groups=8, topk_groups=1).topk_idx(MoEShape(256, 16, 64, 8, "bf16"), 2)


def test_deepep_presets_land_near_the_published_figures():
    """DeepEP's H800 figures (intranode EP8: dispatch 153 GB/s, combine 158 GB/s; low-latency EP256
    over RDMA: 39 / 40 GB/s, counted its way) must sit under the model's bound for the same setup,
    and not far under it."""
    measured = [f for f in PUBLISHED if f.status == "measured"]
    assert {f.name for f in measured} == {"DeepEP intranode, H800", "DeepEP low-latency EP256, H800"}
    for fig, cost in check_published(measured):
        for kind, published in (("dispatch", fig.dispatch_gbps), ("combine", fig.combine_gbps)):
            bound = cost.call(kind).counted_bandwidth / GB
            assert 0.75 < published / bound <= 1.0, (fig.name, kind, published, bound)
        if fig.num_ranks == 8:  # random top-8 of 256 over 8 ranks reaches 8 (1 - C(224, 8) / C(256, 8)) ranks
            expected = 8 * (1 - torch.tensor([(224 - i) / (256 - i) for i in range(8)]).prod().item())
            assert cost.counts.ranks_per_token == pytest.approx(expected, rel=0.01)


def test_bad_shapes_are_typed_errors():
    with pytest.raises(ContractError, match="payload"):
        MoEShape(256, 4, 32, 8, "fp16")
    with pytest.raises(ContractError, match="multiple of 128"):
        MoEShape(200, 4, 32, 8, "fp8")
    with pytest.raises(ContractError, match="num_experts"):
        estimate(MoEShape(256, 4, 30, 8, "bf16"), TWO_TIER, 8)
    with pytest.raises(ContractError, match="spec"):
        parse_tier("NVLink:8:fast:1")
    assert parse_tier("RDMA:*:50:2:3") == Tier("RDMA", None, 50 * GB, 2 * US, hops=3)


SMALL_CLI = ["--hidden", "512", "--topk", "4", "--experts", "32", "--tokens", "64"]


def test_cli_prints_bytes_time_and_assumptions(capsys):
    assert main(["ep-cost", "--preset", "ub-pod-256k", "--ep", "16", *SMALL_CLI]) == 0
    out = capsys.readouterr().out
    assert "UB scale-up" in out and "UBG scale-out" in out and "DeepEP GB/s" in out
    assert "assumptions:" in out and "full duplex" in out


def test_cli_custom_tiers_sweep_check_and_list(capsys):
    assert main(["ep-cost", "--tier", "fast:4:100:1", "--tier", "slow:*:10:2:3", "--sweep", *SMALL_CLI]) == 0
    out = capsys.readouterr().out
    assert "custom" in out and "slow" in out
    assert main(["ep-cost", "--check"]) == 0
    out = capsys.readouterr().out
    assert "153" in out and "158" in out and "375" in out and "claim" in out
    assert main(["ep-cost", "--list"]) == 0
    assert "source: " in capsys.readouterr().out


@pytest.mark.parametrize("argv, names", [
    (["--experts", "30", "--ep", "8"], "num_experts"),
    (["--preset", "ubl128", "--ep", "256"], "EP degree"),
    (["--tier", "NVLink:8"], "--tier"),
    (["--payload", "fp8", "--hidden", "100"], "hidden"),
    (["--topk-idx", "/nonexistent/ids.pt"], "ids.pt"),
])
def test_cli_bad_input_is_one_line_with_exit_code_2(capsys, argv, names):
    assert main(["ep-cost", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("portable_kernels ep-cost: error:") and names in err


def test_cli_reads_a_routing_file(tmp_path, capsys):
    ids = [random_routing(32, 4, 32, seed=90 + r) for r in range(4)]
    path = tmp_path / "ids.pt"
    torch.save(ids, path)
    assert main(["ep-cost", "--topk-idx", str(path), "--ep", "4", "--no-assumptions", *SMALL_CLI]) == 0
    assert "routing given topk_idx" in capsys.readouterr().out
    assert main(["ep-cost", "--topk-idx", str(path), "--ep", "8", *SMALL_CLI]) == 2


def test_cli_plot_is_written(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["ep-cost", "--plot", str(tmp_path), *SMALL_CLI]) == 0
    out = capsys.readouterr().out
    path = tmp_path / "ep_cost_time_per_layer.png"
    assert str(path) in out and "nvlink8-rdma" in out and "ub-pod-256k" in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_doc_states_every_assumption_and_shows_the_plot():
    from pathlib import Path

    from portable_kernels.tools.ep_cost import ASSUMPTIONS
    from portable_kernels.tools.ep_cost.plot import PLOT_NAME

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "ep-cost-model.md").read_text()
    for assumption in ASSUMPTIONS:
        assert assumption in text, assumption
    assert f"img/{PLOT_NAME}" in text and (root / "docs" / "img" / PLOT_NAME).read_bytes()[:4] == b"\x89PNG"


def test_one_rank_moves_nothing_over_the_fabric():
    cost = estimate(SMALL, TWO_TIER, 1, RoutingSpec(seed=11))
    assert cost.seconds == 0.0 and cost.dispatch.phases[-1].bound == "nothing to move"
    assert float(cost.dispatch.traffic.local.sum()) > 0  # every routed row stays on the rank
