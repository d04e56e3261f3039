"""The distributed Buffer (DeepEP's API over torch.distributed) on Gloo: 2, 4 and 8 local ranks
against the single-process contract, faults (a killed and a stalled rank), and one-rank checks of
arguments, sizes, events and the transport's error mapping."""

from __future__ import annotations

import datetime
import re
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import portable_kernels as pk
from portable_kernels.ops.ep import (Buffer, Config, EPTimeoutError, EventHandle, EventOverlap, TorchDistributedTransport,
                                 get_low_latency_rdma_size_hint)
from portable_kernels.ops.ep.buffer import rdma_rank_counts
from portable_kernels.testing.core import CaseFailure
from portable_kernels.testing.ep_buffer_oracle import check_scenario
from portable_kernels.testing.ep_buffer_scenarios import Scenario, run_scenarios
from portable_kernels.testing.ep_cases import random_routing
from portable_kernels.testing.ep_distributed import exec_blocks, run_ranks
from portable_kernels.testing.generators import randn

BUFFER = dict(num_nvl_bytes=int(1e8), num_rdma_bytes=int(1e8), timeout=30)
#: every launch is bounded; a hang fails the test instead of the CI job
LAUNCH_TIMEOUT_S = 150

CORRECTNESS = [
    Scenario("bf16 random routing", seed=1),
    Scenario("fp8 pairs, alignment 4", form="fp8", seed=2, alignment=4),
    Scenario("no weights", weights=False, seed=3),
    Scenario("all tokens to one rank", routing="one-rank", seed=4),
    Scenario("an empty rank that nobody routes to", routing="empty-rank", seed=5),
    Scenario("top-k with repeated ranks", routing="same-rank", num_topk=2, seed=6),
    Scenario("dispatch without topk_idx", kind="no-topk", seed=7, alignment=2),
    Scenario("num_worst_tokens padding", kind="worst", seed=8),
    Scenario("low latency bf16", kind="low-latency", use_fp8=False, seed=9),
    Scenario("low latency fp8", kind="low-latency", seed=10),
    Scenario("low latency fp8 round_scale", kind="low-latency", round_scale=True, seed=11),
    Scenario("low latency fp8 ue8m0", kind="low-latency", round_scale=True, use_ue8m0=True, seed=12),
    Scenario("low latency with an empty rank", kind="low-latency", routing="empty-rank", seed=15),
    Scenario("low latency, all tokens to one rank", kind="low-latency", routing="one-rank", use_fp8=False, seed=16),
]
ERRORS = [
    Scenario("num_experts differs across ranks", kind="mismatch-experts"),
    Scenario("hidden differs across ranks", kind="mismatch-hidden"),
    Scenario("one rank refuses its arguments", kind="bad-arg-on-one-rank"),
    Scenario("dispatch over num_nvl_bytes", kind="over-budget"),
    Scenario("low latency under the rdma hint", kind="ll-over-budget"),
    Scenario("a handle of another dispatch", kind="foreign-handle", seed=13),
    Scenario("normal calls still work after the refusals", seed=14),
]
EIGHT = [CORRECTNESS[0], CORRECTNESS[1], CORRECTNESS[4], CORRECTNESS[9], ERRORS[0]]


def _launch(num_ranks: int, scenarios: list[Scenario]) -> list[dict]:
    outcomes = run_ranks(num_ranks, run_scenarios, (scenarios, BUFFER), timeout_s=LAUNCH_TIMEOUT_S)
    assert all(o.ok for o in outcomes), "\n".join(o.describe() for o in outcomes)
    return [o.value for o in outcomes]


@pytest.fixture(scope="module")
def two_ranks():
    return _launch(2, CORRECTNESS + ERRORS)


@pytest.fixture(scope="module")
def four_ranks():
    return _launch(4, CORRECTNESS + ERRORS)


@pytest.fixture(scope="module")
def eight_ranks():
    return _launch(8, EIGHT)


def _check(values: list[dict], scenario: Scenario) -> None:
    check_scenario(scenario, len(values), [v[scenario.name] for v in values])


@pytest.mark.parametrize("scenario", CORRECTNESS + ERRORS, ids=lambda s: s.name)
def test_two_ranks_match_the_single_process_contract(two_ranks, scenario):
    _check(two_ranks, scenario)


@pytest.mark.parametrize("scenario", CORRECTNESS + ERRORS, ids=lambda s: s.name)
def test_four_ranks_match_the_single_process_contract(four_ranks, scenario):
    _check(four_ranks, scenario)


@pytest.mark.parametrize("scenario", EIGHT, ids=lambda s: s.name)
def test_eight_ranks_match_the_single_process_contract(eight_ranks, scenario):
    _check(eight_ranks, scenario)


def test_the_ep_doc_examples_run_on_two_ranks():
    text = (Path(__file__).resolve().parents[3] / "docs" / "ep.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    outcomes = run_ranks(2, exec_blocks, (blocks, "ep.md"), timeout_s=LAUNCH_TIMEOUT_S)
    assert all(o.ok and o.value is True for o in outcomes), "\n".join(o.describe() for o in outcomes)


def test_the_oracle_catches_a_wrong_rank_result(two_ranks):
    """The scenario checks can fail: a rank result with two rows swapped is refused."""
    scenario = CORRECTNESS[0]
    records = [dict(v[scenario.name]) for v in two_ranks]
    value = dict(records[0]["value"])
    dispatched = value["dispatch"]
    swapped = dispatched.recv_x.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    value["dispatch"] = type(dispatched)(swapped, *list(dispatched)[1:])
    records[0] = {**records[0], "value": value}
    with pytest.raises(CaseFailure, match="recv_x"):
        check_scenario(scenario, 2, records)


# ---------------------------------------------------------------------------- faults

FAULT_TIMEOUT_S = 3.0
#: slack for process scheduling on a loaded 2-core machine
FAULT_SLACK_S = 6.0


def _fault_run(kind: str, num_ranks: int):
    scenarios = [Scenario("fault", kind=kind, num_experts=6, seed=20),
                 Scenario("after the fault", num_experts=6, seed=21)]
    return run_ranks(num_ranks, run_scenarios, (scenarios, {**BUFFER, "timeout": FAULT_TIMEOUT_S}),
                     timeout_s=LAUNCH_TIMEOUT_S)


def _assert_timeout_on_survivors(outcomes, survivors):
    for o in outcomes[:survivors]:
        assert o.ok, o.describe()
        fault, after = o.value["fault"], o.value["after the fault"]
        assert fault.get("error_type") == "EPTimeoutError", fault
        assert "Buffer.dispatch" in fault["error"] and "'default_pg' (gloo" in fault["error"]
        assert fault["seconds"] < FAULT_TIMEOUT_S + FAULT_SLACK_S
        # the group is unusable afterwards: later calls fail at once, typed
        assert after.get("error_type") == "EPTimeoutError" and "unusable" in after["error"]
        assert after["seconds"] < 1.0


def test_a_killed_rank_gives_ep_timeout_error_on_every_survivor():
    outcomes = _fault_run("kill", 3)
    assert outcomes[2].exitcode == 17  # the killed rank
    _assert_timeout_on_survivors(outcomes, 2)


def test_a_rank_that_never_arrives_gives_ep_timeout_error_after_the_timeout():
    start = time.monotonic()
    outcomes = _fault_run("stall", 2)
    assert outcomes[1].ok and outcomes[1].value["fault"]["value"] == "stalled"
    _assert_timeout_on_survivors(outcomes, 1)
    assert outcomes[0].value["fault"]["seconds"] >= FAULT_TIMEOUT_S * 0.9  # it waited for the timeout, no less
    assert time.monotonic() - start < LAUNCH_TIMEOUT_S


# ---------------------------------------------------------------------------- one rank, in process

@pytest.fixture(scope="module")
def solo_group():
    """A real one-rank Gloo group without touching torch.distributed's global state."""
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))


@pytest.fixture()
def solo(solo_group):
    return Buffer(solo_group, int(1e7), int(1e7), timeout=5)


def _layout_args(buffer, idx, experts=4):
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    return dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)


X = randn(6, 128, seed=80, dtype=torch.bfloat16)
IDX = random_routing(6, 2, 4, seed=81)
W = randn(6, 2, seed=82).abs()


def test_get_dispatch_layout_returns_deep_eps_five_values(solo):
    per_rank, rdma, per_expert, in_rank, event = solo.get_dispatch_layout(IDX, 4)
    want = pk.get_dispatch_layout(IDX, 4, 1)
    assert torch.equal(per_rank, want[0]) and torch.equal(per_expert, want[2]) and torch.equal(in_rank, want[3])
    assert rdma is None and isinstance(event, EventOverlap)
    event.current_stream_wait()


def test_rdma_rank_counts_follow_deep_eps_eight_ranks_per_node():
    in_rank = torch.zeros(3, 16, dtype=torch.bool)
    in_rank[0, [0, 7]] = True   # node 0 only, twice
    in_rank[1, [3, 12]] = True  # both nodes
    assert rdma_rank_counts(in_rank).tolist() == [2, 1]
    assert rdma_rank_counts(in_rank.int().bool()).dtype == torch.int32
    assert rdma_rank_counts(torch.ones(3, 8, dtype=torch.bool)) is None
    uneven = torch.zeros(2, 12, dtype=torch.bool)
    uneven[:, 10] = True  # ranks 8..11 form a second, partial node
    assert rdma_rank_counts(uneven).tolist() == [0, 2]


def test_dispatch_handle_indexes_like_deep_eps_tuple(solo):
    out = solo.dispatch(X, topk_idx=IDX, topk_weights=W, **_layout_args(solo, IDX))
    handle = out[4]
    assert len(out) == 6 and isinstance(out[5], EventOverlap)
    assert handle[0] is handle.rank_prefix_matrix and handle[3] is handle.recv_src_idx
    assert handle[4] is handle.is_token_in_rank and handle[1] is None and len(handle) == 6


def test_cached_fp8_dispatch_returns_the_pair_along_the_first_layout(solo):
    first = solo.dispatch(X, topk_idx=IDX, **_layout_args(solo, IDX))
    q = pk.per_token_cast_to_fp8(randn(6, 128, seed=84, dtype=torch.bfloat16))
    recv_x, *rest = solo.dispatch((q.data, q.scale), handle=first[4])
    want = pk.simulate_dispatch([(q.data, q.scale)], handles=[first[4]])[0].recv_x
    assert rest[:4] == [None] * 4 and isinstance(rest[4], EventOverlap)
    assert torch.equal(recv_x[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(recv_x[1], want[1])


def _bad_dispatch(**change):
    def build(buffer):
        args = dict(x=X, topk_idx=IDX, topk_weights=W, **_layout_args(buffer, IDX))
        args.update({k: (v(buffer) if callable(v) else v) for k, v in change.items()})
        return buffer.dispatch(**args)
    return build


def _handle(buffer):
    return buffer.dispatch(X, topk_idx=IDX, **_layout_args(buffer, IDX))[4]


DISPATCH_ERRORS = {
    "x of ints": (_bad_dispatch(x=X.int()), "'x'"),
    "fp8 pair with wrong scales": (_bad_dispatch(x=(X.to(torch.float8_e4m3fn), torch.ones(6, 2))), "'x'"),
    "no is_token_in_rank": (_bad_dispatch(is_token_in_rank=None), "'is_token_in_rank'"),
    "is_token_in_rank not from topk_idx": (_bad_dispatch(is_token_in_rank=torch.zeros(6, 1, dtype=torch.bool)),
                                           "'(is_token_in_rank|num_tokens_per_rank)'"),
    "num_tokens_per_expert of another routing": (_bad_dispatch(num_tokens_per_expert=torch.ones(4, dtype=torch.int32)),
                                                 "'num_tokens_per_expert'"),
    "expert id too large": (_bad_dispatch(topk_idx=IDX.clamp(max=3) + 1), "'(topk_idx|is_token_in_rank)'"),
    "weights fp64": (_bad_dispatch(topk_weights=W.double()), "'topk_weights'"),
    "weights without ids": (_bad_dispatch(topk_idx=None), "'topk_weights'"),
    "alignment zero": (_bad_dispatch(expert_alignment=0), "'expert_alignment'"),
    "num_worst_tokens negative": (_bad_dispatch(num_worst_tokens=-1), "'num_worst_tokens'"),
    "num_worst_tokens too small": (_bad_dispatch(num_worst_tokens=1), "'num_worst_tokens'"),
    "config not a Config": (_bad_dispatch(config="fast"), "'config'"),
    "previous_event not an event": (_bad_dispatch(previous_event=object()), "'previous_event'"),
    "async_finish not a bool": (_bad_dispatch(async_finish=1), "'async_finish'"),
    "handle with topk_idx": (_bad_dispatch(handle=_handle), "'topk_idx'"),
    "handle of other tokens": (lambda b: b.dispatch(X[:3], handle=_handle(b)), "'x'"),
}


@pytest.mark.parametrize("name", list(DISPATCH_ERRORS))
def test_dispatch_bad_input(solo, name):
    build, arg = DISPATCH_ERRORS[name]
    with pytest.raises(pk.ContractError, match=arg):
        build(solo)


def _ll_dispatch(buffer, **kw):
    args = dict(x=X, topk_idx=IDX, num_max_dispatch_tokens_per_rank=8, num_experts=4)
    args.update(kw)
    return buffer.low_latency_dispatch(**args)


def _ll_handle(buffer):
    return _ll_dispatch(buffer, use_fp8=False)[2]


LL_ERRORS = {
    "more tokens than the max": (lambda b: _ll_dispatch(b, num_max_dispatch_tokens_per_rank=4), "'x'"),
    "ue8m0 without round_scale": (lambda b: _ll_dispatch(b, use_ue8m0=True), "'use_ue8m0'"),
    "NaN with round_scale": (lambda b: _ll_dispatch(b, x=torch.where(X > 2, float("nan"), X), round_scale=True),
                             "'x'.*NaN"),
    "stats of the wrong shape": (lambda b: _ll_dispatch(b, cumulative_local_expert_recv_stats=torch.zeros(3)),
                                 "'cumulative_local_expert_recv_stats'"),
    "prepare_for without fp8": (lambda b: _ll_dispatch(b, use_fp8=False, prepare_for="m_grouped_fp8_gemm_nt_masked"),
                                "'prepare_for'"),
    "combine with a tuple handle": (lambda b: b.low_latency_combine(torch.zeros(4, 8, 128, dtype=torch.bfloat16), IDX,
                                                                    W, tuple(_ll_handle(b))), "'handle'"),
    "combine without weights": (lambda b: b.low_latency_combine(torch.zeros(4, 8, 128, dtype=torch.bfloat16), IDX, None,
                                                                _ll_handle(b)), "'topk_weights'"),
    "combine x of the wrong shape": (lambda b: b.low_latency_combine(torch.zeros(4, 4, 128, dtype=torch.bfloat16), IDX,
                                                                     W, _ll_handle(b)), "'x'"),
}


@pytest.mark.parametrize("name", list(LL_ERRORS))
def test_low_latency_bad_input(solo, name):
    build, arg = LL_ERRORS[name]
    with pytest.raises(pk.ContractError, match=arg):
        build(solo)


def test_low_latency_combine_refuses_routing_its_handle_did_not_dispatch(solo):
    _, _, handle, _, _ = _ll_dispatch(solo, use_fp8=False)
    other = torch.where(IDX >= 0, (IDX + 1) % 4, IDX)
    with pytest.raises(pk.ContractError, match="'handle'"):
        solo.low_latency_combine(torch.zeros(4, 8, 128, dtype=torch.bfloat16), other, W, handle)


def test_buffer_construction_errors(solo_group):
    with pytest.raises(pk.ContractError, match="'group'"):
        Buffer(None)
    with pytest.raises(pk.ContractError, match="mpi4py"):
        Buffer(None, comm=object())
    with pytest.raises(pk.ContractError, match="'enable_shrink'"):
        Buffer(solo_group, 1, enable_shrink=True)
    with pytest.raises(pk.ContractError, match="'num_nvl_bytes'"):
        Buffer(solo_group, -1)


def test_normal_mode_needs_num_nvl_bytes(solo_group):
    buffer = Buffer(solo_group, 0, int(1e7), low_latency_mode=True)
    with pytest.raises(pk.ContractError, match="'num_nvl_bytes'"):
        buffer.dispatch(X, topk_idx=IDX, **_layout_args(buffer, IDX))


def test_destroy_follows_explicitly_destroy(solo_group):
    with pytest.raises(pk.ContractError, match="'explicitly_destroy'"):
        Buffer(solo_group, 1).destroy()
    buffer = Buffer(solo_group, int(1e7), explicitly_destroy=True)
    buffer.destroy()
    with pytest.raises(pk.ContractError, match="destroyed"):
        buffer.dispatch(X, topk_idx=IDX, **_layout_args(buffer, IDX))


def test_low_latency_prepare_for_feeds_the_masked_gemm_without_conversion(solo):
    recv_x, recv_count, _, _, _ = _ll_dispatch(solo, prepare_for="m_grouped_fp8_gemm_nt_masked")
    raw, _, _, _, _ = _ll_dispatch(solo)
    assert isinstance(recv_x, pk.PreparedTensor)
    b = pk.per_block_cast_to_fp8(randn(4, 128, 128, seed=83, dtype=torch.bfloat16),
                                 prepare_for="m_grouped_fp8_gemm_nt_masked", arg="b")
    d_prepared = torch.zeros(4, 8, 128, dtype=torch.bfloat16)
    d_raw = torch.zeros(4, 8, 128, dtype=torch.bfloat16)
    before = pk.implicit_conversions()
    pk.m_grouped_fp8_gemm_nt_masked(recv_x, b, d_prepared, recv_count, 8)
    assert pk.implicit_conversions() == before
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pk.ImplicitConversionWarning)
        pk.m_grouped_fp8_gemm_nt_masked(raw, b, d_raw, recv_count, 8)  # DeepEP's raw pair: converted, counted
    assert pk.implicit_conversions() == before + 1
    assert torch.equal(d_prepared, d_raw)


def test_low_latency_scales_are_deep_eps_column_major(solo):
    (data, scales), _, _, _, _ = _ll_dispatch(solo)
    assert data.dtype == torch.float8_e4m3fn and scales.shape == (4, 8, 1) and scales.stride()[1] == 1
    (_, packed), _, _, _, _ = _ll_dispatch(solo, round_scale=True, use_ue8m0=True)
    assert packed.dtype == torch.int32 and packed.shape == (4, 8, 1)


# ---------------------------------------------------------------------------- sizes, events, transport

def test_low_latency_rdma_size_hint_known_answer():
    # M=1, H=128, R=1, E=1: dispatch message 16 + max(256, 132) = 272, combine message 4 + 256 = 260;
    # send = recv = 272; signalling 128; 2·(272 + 272 + 128) = 1344, rounded up past 128 -> 1408
    assert get_low_latency_rdma_size_hint(1, 128, 1, 1) == 1408
    assert Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 256) > get_low_latency_rdma_size_hint(64, 7168, 8, 256)
    with pytest.raises(pk.ContractError, match="'hidden'"):
        get_low_latency_rdma_size_hint(1, 0, 1, 1)


def test_config_hints_scale_with_rows_and_nodes():
    config = Buffer.get_dispatch_config(8)
    assert isinstance(config, Config) and config.num_max_nvl_chunked_recv_tokens == 256
    assert config.get_nvl_buffer_size_hint(7168 * 2, 8) > config.get_nvl_buffer_size_hint(7168 * 2, 2)
    assert config.get_rdma_buffer_size_hint(7168 * 2, 8) == 0 and config.get_rdma_buffer_size_hint(7168 * 2, 16) > 0
    with pytest.raises(pk.ContractError, match="'num_max_nvl_chunked_recv_tokens'"):
        Config(20, 6, 0)


def test_event_overlap_waits_runs_its_hook_once_and_releases():
    event = EventOverlap(EventHandle(), extra_tensors=(torch.ones(1),))
    calls = []
    event.register_hook_after_wait(lambda: calls.append(1))
    with event(release_handle=True):
        pass
    assert calls == [1] and event.event is None and event.extra_tensors is None
    event.current_stream_wait()  # nothing left to wait for
    assert calls == [1] and not EventHandle().is_device_event and EventHandle().query()
    assert isinstance(Buffer.capture(), EventOverlap)


class _DeadGroup:
    """A group whose collectives fail like a Gloo group with a dead peer."""

    group_desc = "dead-group"

    def rank(self):
        return 0

    def size(self):
        return 2

    def name(self):
        return "gloo"

    def alltoall_base(self, out, inp, out_splits, in_splits, opts):
        raise RuntimeError("Connection reset by peer")


def test_a_failed_collective_becomes_ep_timeout_error_and_the_transport_stays_broken():
    transport = TorchDistributedTransport(_DeadGroup(), timeout=1.5)
    expected = "Buffer.combine: the header exchange.*'dead-group' \\(gloo, 2 ranks\\).*1.5 s"
    with pytest.raises(EPTimeoutError, match=expected):
        transport.all_gather(torch.zeros(3, dtype=torch.int64), "Buffer.combine")
    with pytest.raises(EPTimeoutError, match="unusable"):
        transport.all_to_all(torch.zeros(1), torch.zeros(1), [1, 0], [1, 0], "Buffer.dispatch")
    assert issubclass(EPTimeoutError, pk.PortableKernelsError) and issubclass(EPTimeoutError, TimeoutError)
