"""The Ascend MC2 low-latency engine (torch_npu's npu_moe_distribute_dispatch_v2 / combine_v2)
against the all-to-all engine, on 2 and 4 Gloo ranks with the documented-semantics stand-in of the
two ops (tests/backends/ascend/ascend_stub/mc2.py). It proves the engine follows the documented contract and
converts to and from DeepEP's masked layout; it does not prove what an NPU computes (not run on one)."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import portable_kernels as pk
from ascend_stub import StandInError, make_stand_in, register_group
from portable_kernels.backends.ascend.providers import ep as ascend_ep
from portable_kernels.backends.ascend.vendor.mc2 import Mc2LowLatencyEngine, Mc2LowLatencyHandle
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.ops.ep import AllToAllLowLatencyEngine, Buffer
from portable_kernels.ops.ep.constants import NO_EXPERT
from portable_kernels.testing.ep_cases import random_routing
from portable_kernels.testing.ep_distributed import run_ranks

HIDDEN, MAX_TOKENS, TOPK = 1024, 12, 3
LAUNCH_TIMEOUT_S = 150

#: (name, experts per rank, use_fp8, round_scale, use_ue8m0, routing, engine path expected)
CASES = [
    ("bf16", 2, False, False, False, "full", "mc2"),
    ("bf16, tokens routed nowhere", 3, False, False, False, "some-nowhere", "mc2"),
    ("bf16, all tokens to rank 0", 3, False, False, False, "rank0", "mc2"),
    ("bf16, one expert per rank", 1, False, False, False, "full", "mc2"),
    ("bf16, partial -1 rows", 2, False, False, False, "partial", "all_to_all"),
    ("fp8", 2, True, False, False, "some-nowhere", "all_to_all"),
    ("fp8 round_scale", 2, True, True, False, "full", "all_to_all"),
    ("fp8 ue8m0", 2, True, True, True, "full", "all_to_all"),
]


def _routing(kind: str, tokens: int, experts: int, seed: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "partial":
        return random_routing(tokens, TOPK, experts, seed)
    if kind == "rank0":  # the first TOPK experts, all on rank 0 (cases with TOPK experts per rank)
        return torch.rand(tokens, TOPK, generator=gen).argsort(dim=1)
    k = min(TOPK, experts)
    idx = torch.rand(tokens, experts, generator=gen).topk(k, dim=1).indices
    if kind == "some-nowhere":
        idx[torch.rand(tokens, generator=gen) < 0.3] = NO_EXPERT
        idx[0] = NO_EXPERT
        idx[-1] = torch.arange(k)  # at least one routed token on every rank
    return idx


def _same_rows(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_same_rows(x, y) for x, y in zip(a, b))
    return torch.equal(a.view(torch.uint8) if a.dtype.itemsize == 1 else a, b.view(torch.uint8) if b.dtype.itemsize == 1 else b)


def _compare(rank: int, num_ranks: int, group, cases, soc: str = "910c") -> dict:
    """On every rank: the same low-latency calls through a Buffer on the all-to-all engine and one on
    the MC2 engine (stand-in ops for `soc`); returns per case the MC2 engine's paths and the largest
    combine difference, after asserting that dispatch results are equal."""
    npu = make_stand_in(soc)
    name = register_group(group)
    plain = Buffer(group, 0, int(1e8), timeout=30)
    mc2 = Buffer(group, 0, int(1e8), timeout=30, low_latency_engine=Mc2LowLatencyEngine.factory(npu=npu, group_name=name))
    assert isinstance(plain.low_latency_engine, AllToAllLowLatencyEngine)
    out = {}
    for seed, (case, per_rank, use_fp8, round_scale, use_ue8m0, routing, _) in enumerate(cases):
        experts = per_rank * num_ranks
        gen = torch.Generator().manual_seed(1000 * seed + rank)
        tokens = MAX_TOKENS - (rank % 3)  # ranks send different numbers of tokens
        x = (torch.randn(tokens, HIDDEN, generator=gen) * 2).bfloat16()
        idx = _routing(routing, tokens, experts, 1000 * seed + rank, gen)
        weights = torch.rand(idx.shape, generator=gen)
        flags = dict(use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=use_ue8m0)
        a_x, a_count, a_handle, _, _ = plain.low_latency_dispatch(x, idx, MAX_TOKENS, experts, **flags)
        b_x, b_count, b_handle, _, _ = mc2.low_latency_dispatch(x, idx, MAX_TOKENS, experts, **flags)
        assert torch.equal(a_count, b_count), case
        assert torch.equal(a_handle.recv_layout_range, b_handle.recv_layout_range), case
        valid = torch.arange(MAX_TOKENS * num_ranks) < a_count[:, None].long()
        assert torch.equal(a_handle.recv_src_info[valid], b_handle.recv_src_info[valid]), case
        rows_a = a_x if isinstance(a_x, tuple) else (a_x,)
        rows_b = b_x if isinstance(b_x, tuple) else (b_x,)
        for ra, rb in zip(rows_a, rows_b):
            assert _same_rows(ra[valid], rb[valid]), f"{case}: recv_x differs in valid slots"
        # the expert outputs: a per-slot transform of the received rows (dequantized for FP8)
        expert_in = pk.dequantize(a_x).float() if use_fp8 else a_x.float()
        expert_out = (expert_in * 0.75 + 0.5).bfloat16()
        a_out, _, _ = plain.low_latency_combine(expert_out, idx, weights, a_handle)
        b_out, _, _ = mc2.low_latency_combine(expert_out, idx, weights, b_handle)
        assert a_out.dtype == b_out.dtype == torch.bfloat16 and a_out.shape == b_out.shape == (tokens, HIDDEN)
        nowhere = (idx < 0).all(dim=1)
        assert bool((b_out[nowhere] == 0).all()), f"{case}: a token routed nowhere came back non-zero"
        out[case] = dict(paths=list(mc2.low_latency_engine.paths)[-2:], handle_type=type(b_handle).__name__,
                         diff=float((a_out.float() - b_out.float()).abs().max()),
                         scale=float(b_out.float().abs().max()), calc_diff=float(pk.calc_diff(a_out, b_out)))
    # an MC2 dispatch combined from fp32 expert outputs (not an MC2 dtype): the all-to-all engine
    # combines with the MC2 handle, on every rank
    x = torch.randn(MAX_TOKENS, HIDDEN, generator=gen).bfloat16()
    idx = _routing("full", MAX_TOKENS, 2 * num_ranks, 0, gen)
    weights = torch.rand(idx.shape, generator=gen)
    a_x, _, a_handle, _, _ = plain.low_latency_dispatch(x, idx, MAX_TOKENS, 2 * num_ranks, use_fp8=False)
    _, _, b_handle, _, _ = mc2.low_latency_dispatch(x, idx, MAX_TOKENS, 2 * num_ranks, use_fp8=False)
    a_out, _, _ = plain.low_latency_combine(a_x.float() * 3, idx, weights, a_handle)
    b_out, _, _ = mc2.low_latency_combine(a_x.float() * 3, idx, weights, b_handle)
    out["fp32 combine"] = dict(paths=list(mc2.low_latency_engine.paths)[-2:], equal=torch.equal(a_out, b_out),
                               dtype=str(b_out.dtype))
    # one rank's bad argument: a typed error on every rank, through the MC2 engine's agreement
    bad = torch.randn(MAX_TOKENS + (1 if rank == 0 else 0), HIDDEN).bfloat16()
    idx = torch.zeros(bad.shape[0], TOPK, dtype=torch.int64) + torch.arange(TOPK)
    try:
        mc2.low_latency_dispatch(bad, idx, MAX_TOKENS, 2 * num_ranks, use_fp8=False)
        out["bad-arg"] = None
    except pk.ContractError as exc:
        out["bad-arg"] = str(exc)
    out["calls"] = sorted(set(npu.calls))
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}-ranks")
def compared(request):
    outcomes = run_ranks(request.param, _compare, (CASES,), timeout_s=LAUNCH_TIMEOUT_S)
    assert all(o.ok for o in outcomes), "\n".join(o.describe() for o in outcomes)
    return [o.value for o in outcomes]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_mc2_engine_matches_the_all_to_all_engine(compared, case):
    name, *_, path = case
    for value in compared:
        got = value[name]
        assert got["paths"] == [path, path]
        assert got["handle_type"] == ("Mc2LowLatencyHandle" if path == "mc2" else "LowLatencyHandle")
        # the same fp32 sums in another order, each rounded once to bf16
        assert got["diff"] <= 2 ** -7 * max(got["scale"], 1.0), got
        assert got["calc_diff"] < 1e-5, got


def test_mc2_engine_called_the_two_ops(compared):
    assert all(v["calls"] == ["npu_moe_distribute_combine_v2", "npu_moe_distribute_dispatch_v2"] for v in compared)


def test_mc2_handle_combines_on_the_all_to_all_engine_when_mc2_declines(compared):
    for value in compared:
        assert value["fp32 combine"] == dict(paths=["mc2", "all_to_all"], equal=True, dtype="torch.float32")


def test_mc2_engine_reports_one_ranks_bad_argument_on_every_rank(compared):
    assert all(v["bad-arg"] is not None and "num_max_dispatch_tokens_per_rank" in v["bad-arg"] for v in compared)


# ------------------------------------------------------------------ the stand-in's documented constraints

def _constraints(rank: int, num_ranks: int, group) -> dict:
    npu = make_stand_in("910c")
    name = register_group(group)
    x = torch.randn(4, HIDDEN).bfloat16()
    ids = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=torch.int32)
    dispatch = npu.npu_moe_distribute_dispatch_v2
    calls = {
        "int64 expert_ids": lambda: dispatch(x, ids.long(), name, num_ranks, rank, 4),
        "-1 expert id": lambda: dispatch(x, ids.masked_fill(ids == 3, -1), name, num_ranks, rank, 4),
        "repeated expert id": lambda: dispatch(x, ids.masked_fill(ids == 3, 0), name, num_ranks, rank, 4),
        "experts not divisible": lambda: dispatch(x, ids, name, num_ranks, rank, 5),
        "quant_mode 1": lambda: dispatch(x, ids, name, num_ranks, rank, 4, quant_mode=1),
        "fp32 x": lambda: dispatch(x.float(), ids, name, num_ranks, rank, 4),
        "hidden under 1024 on A3": lambda: dispatch(x[:, :512], ids, name, num_ranks, rank, 4),
        "A2 hierarchy world size": lambda: make_stand_in("910b").npu_moe_distribute_dispatch_v2(
            x, ids, name, num_ranks, rank, 4, comm_alg="hierarchy"),
        "A2 H not a multiple of 32": lambda: make_stand_in("910b").npu_moe_distribute_dispatch_v2(
            x[:, :1000], ids, name, num_ranks, rank, 4, comm_alg="fullmesh"),
        "A3 combine with fullmesh_v1": lambda: npu.npu_moe_distribute_combine_v2(
            torch.zeros(8, HIDDEN).bfloat16(), ids, torch.zeros(8 * 128, dtype=torch.int32),
            torch.zeros(4, dtype=torch.int32), torch.ones(4, 2), name, num_ranks, rank, 4, comm_alg="fullmesh_v1"),
        "A3 dispatch with expert_scales": lambda: dispatch(x, ids, name, num_ranks, rank, 4,
                                                           expert_scales=torch.ones(4, 2)),
        "wrong rank id": lambda: dispatch(x, ids, name, num_ranks, (rank + 1) % num_ranks, 4),
        "unknown group": lambda: dispatch(x, ids, "no-such-group", num_ranks, rank, 4),
        # last: it raises after a collective, which every rank reaches in the same order
        "global_bs under max_bs * R": lambda: dispatch(x, ids, name, num_ranks, rank, 4, global_bs=num_ranks),
    }
    out = {}
    for key, call in calls.items():
        try:
            call()
            out[key] = None
        except StandInError as exc:
            out[key] = str(exc)
    return out


def test_stand_in_raises_on_documented_constraints():
    outcomes = run_ranks(2, _constraints, (), timeout_s=LAUNCH_TIMEOUT_S)
    assert all(o.ok for o in outcomes), "\n".join(o.describe() for o in outcomes)
    for o in outcomes:
        refused = {k: v for k, v in o.value.items() if v is None}
        assert not refused, f"rank {o.rank}: accepted {sorted(refused)}"


# ------------------------------------------------------------------ Atlas A2, limits from the docs, row order

A2_CASES = [c for c in CASES if c[0] in ("bf16", "bf16, tokens routed nowhere", "bf16, partial -1 rows")]


def test_mc2_engine_runs_on_atlas_a2_at_2_ranks_with_expand_scales():
    """A2 at 2 ranks (comm_alg fullmesh: 2-8 ranks are documented; the old figures said 16/32/64 only):
    the MC2 path runs, and combine gets dispatch's expand_scales, which the A2 stand-in requires."""
    outcomes = run_ranks(2, _compare, (A2_CASES, "910b"), timeout_s=LAUNCH_TIMEOUT_S)
    assert all(o.ok for o in outcomes), "\n".join(o.describe() for o in outcomes)
    for o in outcomes:
        for name, *_, path in A2_CASES:
            got = o.value[name]
            assert got["paths"] == [path, path], (name, got)
            assert got["diff"] <= 2 ** -7 * max(got["scale"], 1.0) and got["calc_diff"] < 1e-5, (name, got)


@pytest.mark.parametrize("chip,args,allowed", [
    ("a2", (2, 4096, 256, 8, 8), True),        # 2 ranks: fullmesh lists 2-8
    ("a2", (128, 7168, 256, 1024, 16), True),  # 128 ranks, H 7168, BS 256, 1024 experts, K 16
    ("a2", (9, 4096, 64, 18, 8), False),       # 9 ranks: not in the list
    ("a2", (8, 7200, 64, 16, 8), False),       # H > 7168
    ("a2", (8, 4100, 64, 16, 8), False),       # H not a multiple of 32
    ("a2", (8, 4096, 257, 16, 8), False),      # BS > 256
    ("a2", (8, 4096, 64, 1032, 8), False),     # more than 1024 experts
    ("a3", (768, 8192, 512, 768, 8), True),    # 768 ranks, H 8192, BS 512
    ("a3", (2, 1024, 12, 4, 3), True),
    ("a3", (769, 4096, 64, 769, 8), False),    # 769 ranks
    ("a3", (16, 8448, 64, 32, 8), False),      # H > 8192
    ("a3", (16, 1000, 64, 32, 8), False),      # H < 1024
    ("a3", (16, 4096, 513, 32, 8), False),     # BS > 512
    ("a3", (16, 4096, 64, 32, 17), False),     # K > 16
    (None, (16, 4096, 64, 32, 8), False),      # not an A2/A3
])
def test_mc2_limits_follow_the_torch_npu_pages(chip, args, allowed):
    from portable_kernels.backends.ascend.vendor.mc2 import limits_reason
    why = limits_reason(chip, *args)
    assert (why is None) == allowed, why
    if not allowed:
        assert "torch_npu-npu_moe_distribute" in why or "A2 and A3 only" in why


def _row_order(rank: int, num_ranks: int, group, soc: str, reverse: bool = False) -> dict:
    from portable_kernels.backends.ascend.vendor.mc2 import row_order_self_test
    npu = make_stand_in(soc)
    if reverse:  # a dispatch whose rows arrive in the opposite order inside each expert's block
        dispatch = npu.npu_moe_distribute_dispatch_v2

        def reversed_rows(*args, **kwargs):
            expand_x, *rest = dispatch(*args, **kwargs)
            counts, start, out = rest[2].tolist(), 0, expand_x.clone()
            for c in counts:
                out[start:start + c] = expand_x[start:start + c].flip(0)
                start += c
            return (out, *rest)
        npu.npu_moe_distribute_dispatch_v2 = reversed_rows
    report = row_order_self_test(group, npu, register_group(group))
    return dict(ok=report.ok, chip=report.chip, detail=report.detail, observed=report.observed)


@pytest.mark.parametrize("soc", ["910b", "910c"])
def test_mc2_row_order_self_test_passes_on_the_stand_in(soc):
    """The self-test an NPU run executes (benchmarks/device_check_ascend.py): on the stand-in, whose rows
    follow the engine's assumption by construction, it must pass and see every routed row."""
    outcomes = run_ranks(2, _row_order, (soc,), timeout_s=LAUNCH_TIMEOUT_S)
    assert all(o.ok for o in outcomes), "\n".join(o.describe() for o in outcomes)
    for o in outcomes:
        assert o.value["ok"], o.value
        assert sum(len(block) for block in o.value["observed"]) > 0


def test_mc2_row_order_self_test_catches_another_order():
    outcomes = run_ranks(2, _row_order, ("910c", True), timeout_s=LAUNCH_TIMEOUT_S)
    assert all(o.ok for o in outcomes), "\n".join(o.describe() for o in outcomes)
    assert not any(o.value["ok"] for o in outcomes)
    assert all("another order" in o.value["detail"] for o in outcomes), [o.value["detail"] for o in outcomes]


# ------------------------------------------------------------------ engine selection

def _solo_group():
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))


def test_the_all_to_all_engine_runs_without_torch_npu_or_hccl(monkeypatch):
    buffer = Buffer(_solo_group(), 0, int(1e7))
    assert isinstance(buffer.low_latency_engine, AllToAllLowLatencyEngine)
    assert "not HCCL" in buffer.low_latency_engine_reasons["ascend.mc2"]
    monkeypatch.setattr(ascend_ep.mc2, "group_backend", lambda group: "hccl")
    monkeypatch.setattr(ascend_ep.mc2, "torch_npu_module", lambda: None)
    buffer = Buffer(_solo_group(), 0, int(1e7))
    assert isinstance(buffer.low_latency_engine, AllToAllLowLatencyEngine)
    assert buffer.low_latency_engine_reasons["ascend.mc2"] == "torch_npu does not import here"


def test_an_hccl_group_with_torch_npu_gets_the_mc2_engine(monkeypatch):
    npu = make_stand_in("910c")
    monkeypatch.setattr(ascend_ep.mc2, "group_backend", lambda group: "hccl")
    monkeypatch.setattr(ascend_ep.mc2, "torch_npu_module", lambda: npu)
    with trace_providers() as ran:
        buffer = Buffer(_solo_group(), 0, int(1e7))
    engine = buffer.low_latency_engine
    assert isinstance(engine, Mc2LowLatencyEngine) and engine.chip == "a3"
    assert buffer.low_latency_engine_name == "ascend.mc2"
    assert ran == [("ep_low_latency_engine", "ascend", "mc2")]


def test_mc2_engine_needs_torch_npu(monkeypatch):
    monkeypatch.setattr(ascend_ep.mc2, "torch_npu_module", lambda: None)
    with pytest.raises(pk.ContractError, match="'npu'"):
        Buffer(_solo_group(), 0, int(1e7), low_latency_engine=Mc2LowLatencyEngine.factory())


def test_mc2_handle_unpacks_like_deep_eps_tuple():
    info, ranges = torch.zeros(1, 2, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int64)
    handle = Mc2LowLatencyHandle(info, ranges, 2, 128, 1)
    assert len(handle) == 5 and tuple(handle)[2:] == (2, 128, 1) and handle.mc2 is None
