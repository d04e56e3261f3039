"""Scenarios for the distributed `portable_kernels.ops.ep.Buffer`: what each rank runs, and how the
results of all ranks are held to the single-process contract.

A `Scenario` names its inputs (seeded, so any process can rebuild every rank's inputs) and a
`kind`. `run_scenarios` is the per-rank worker (for `ep_distributed.run_ranks`): it builds one
Buffer on the group and runs each scenario, recording the value or the error per scenario (every
error is raised on every rank alike, so the ranks stay in step). `check_scenario` is the oracle
side, in the calling process: it rebuilds all ranks' inputs, runs the `simulate_*` reference and
the `ep_cases.check_*` property checks, and raises CaseFailure on any difference.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import attrs
import torch

from ..ops.ep import Buffer, DispatchResult, LowLatencyDispatchResult
from ..ops.gemm.grouped import m_grouped_fp8_gemm_nt_masked
from ..layouts.fp8_scales import sm100_ue8m0_decode
from ..core.numerics import calc_diff
from ..ops.quant.fp8 import dequantize, per_block_cast_to_fp8, per_token_cast_to_fp8
from .ep_cases import (low_latency_expert_outputs, random_routing)
from .generators import generator, randn

#: calc_diff bound of the masked FP8 GEMM on received rows against dequantized operands
GEMM_BOUND = 1e-5
#: GEMM output width in the low-latency scenarios
GEMM_N = 128


@attrs.frozen
class Scenario:
    """One call pattern. routing: random | one-rank | empty-rank | same-rank; form: bf16 | fp8;
    kind: normal | no-topk | worst | low-latency | mismatch-experts | mismatch-hidden | bad-arg-on-one-rank
    | over-budget | ll-over-budget | foreign-handle | kill | stall."""

    name: str
    kind: str = "normal"
    tokens: int = 12
    num_topk: int = 3
    num_experts: int = 8
    hidden: int = 128
    routing: str = "random"
    form: str = "bf16"
    weights: bool = True
    alignment: int = 1
    seed: int = 0
    use_fp8: bool = True
    round_scale: bool = False
    use_ue8m0: bool = False


# ------------------------------------------------------------------------------------------ inputs

def num_tokens(s: Scenario, rank: int, num_ranks: int) -> int:
    if s.routing == "empty-rank" and rank == num_ranks - 1:
        return 0
    return s.tokens + rank


def routing(s: Scenario, rank: int, num_ranks: int) -> torch.Tensor:
    tokens, seed = num_tokens(s, rank, num_ranks), s.seed + 10 * rank + 1
    per_rank = s.num_experts // num_ranks
    if s.routing == "random":
        return random_routing(tokens, s.num_topk, s.num_experts, seed)
    g = generator(seed)
    if s.routing == "one-rank":  # every token chooses only experts of rank 0
        choices = torch.stack([torch.randperm(per_rank, generator=g) for _ in range(tokens)]) if tokens else \
            torch.empty(0, per_rank, dtype=torch.int64)
    elif s.routing == "same-rank":  # all of a token's experts on one (random) rank: k entries, one destination
        owner = torch.randint(num_ranks, (tokens, 1), generator=g)
        local = torch.stack([torch.randperm(per_rank, generator=g) for _ in range(tokens)]) if tokens else \
            torch.empty(0, per_rank, dtype=torch.int64)
        choices = local + owner * per_rank
    elif s.routing == "empty-rank":  # nobody routes to the last rank
        allowed = s.num_experts - per_rank
        choices = torch.rand(tokens, allowed, generator=g).argsort(dim=1)
    else:
        raise ValueError(f"unknown routing {s.routing!r}")
    idx = torch.full((tokens, s.num_topk), -1, dtype=torch.int64)
    width = min(s.num_topk, choices.shape[1])
    idx[:, :width] = choices[:, :width]
    return idx


def scenario_inputs(s: Scenario, rank: int, num_ranks: int) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    """(x — bf16 [T, H] or an FP8 (data, scales) pair —, topk_idx [T, k], fp32 weights or None) of one rank."""
    tokens = num_tokens(s, rank, num_ranks)
    x = randn(tokens, s.hidden, seed=s.seed + 10 * rank, dtype=torch.bfloat16)
    weights = randn(tokens, s.num_topk, seed=s.seed + 10 * rank + 2).abs() + 0.1 if s.weights else None
    if s.form == "fp8":
        q = per_token_cast_to_fp8(x)
        x = (q.data, q.scale)
    return x, routing(s, rank, num_ranks), weights


def combine_rows(recv_x: Any, rank: int) -> torch.Tensor:
    """What an expert rank returns in the normal-mode scenarios: its received rows (dequantized) times rank + 1."""
    rows = dequantize(recv_x) if isinstance(recv_x, tuple) else recv_x.float()
    return (rows * (rank + 1)).bfloat16()


def second_tokens(s: Scenario, rank: int, num_ranks: int) -> torch.Tensor:
    """New bf16 tokens for a cached dispatch along the first dispatch's layout."""
    return randn(num_tokens(s, rank, num_ranks), s.hidden, seed=s.seed + 10 * rank + 99, dtype=torch.bfloat16)


def gemm_weights(s: Scenario, num_ranks: int) -> torch.Tensor:
    """bf16 [E, N, H] expert weights of the masked-GEMM check (rank r uses its L experts)."""
    return randn(s.num_experts, GEMM_N, s.hidden, seed=s.seed + 7, dtype=torch.bfloat16)


# ------------------------------------------------------------------------------------------ rank side

def _normal(buffer: Buffer, rank: int, num_ranks: int, s: Scenario) -> dict[str, Any]:
    x, idx, w = scenario_inputs(s, rank, num_ranks)
    per_rank, rdma, per_expert, in_rank, event = buffer.get_dispatch_layout(idx, s.num_experts)
    recv_x, recv_idx, recv_w, counts, handle, event = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=idx, topk_weights=w, expert_alignment=s.alignment)
    event.current_stream_wait()
    combined, combined_w, _ = buffer.combine(combine_rows(recv_x, rank), handle, recv_w)
    cached = buffer.dispatch(second_tokens(s, rank, num_ranks), handle=handle)
    return {"layout": (per_rank, rdma, per_expert, in_rank),
            "dispatch": DispatchResult(recv_x, recv_idx, recv_w, tuple(counts), handle),
            "combine": (combined, combined_w), "cached": cached[:5]}


def _no_topk(buffer: Buffer, rank: int, num_ranks: int, s: Scenario) -> dict[str, Any]:
    x, idx, _ = scenario_inputs(s, rank, num_ranks)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, s.num_experts)
    out = buffer.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                          num_tokens_per_expert=per_expert, expert_alignment=s.alignment)
    recv_x, handle = out[0], out[4]
    combined, combined_w, _ = buffer.combine(combine_rows(recv_x, rank), handle)
    return {"dispatch": out[:5], "combine": (combined, combined_w)}


def _worst(buffer: Buffer, rank: int, num_ranks: int, s: Scenario) -> dict[str, Any]:
    x, idx, w = scenario_inputs(s, rank, num_ranks)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, s.num_experts)
    worst = (s.tokens + num_ranks) * num_ranks
    out = buffer.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                          topk_idx=idx, topk_weights=w, num_worst_tokens=worst)
    combined, combined_w, _ = buffer.combine(combine_rows(out[0], rank), out[4], out[2])
    return {"dispatch": out[:5], "combine": (combined, combined_w), "worst": worst}


def _low_latency(buffer: Buffer, rank: int, num_ranks: int, s: Scenario) -> dict[str, Any]:
    x, idx, w = scenario_inputs(s, rank, num_ranks)
    max_tokens = s.tokens + num_ranks
    stats = torch.zeros(s.num_experts // num_ranks, dtype=torch.int32)
    recv_x, recv_count, handle, event, hook = buffer.low_latency_dispatch(
        x, idx, max_tokens, s.num_experts, cumulative_local_expert_recv_stats=stats, use_fp8=s.use_fp8,
        round_scale=s.round_scale, use_ue8m0=s.use_ue8m0, return_recv_hook=True)
    hook()
    logical = recv_x
    if s.use_ue8m0:
        logical = (recv_x[0], sm100_ue8m0_decode(recv_x[1], s.hidden // 128))
    result = LowLatencyDispatchResult(logical, recv_count, handle)
    gemm_diff = _masked_gemm(logical, recv_count, rank, num_ranks, s) if s.use_fp8 else None
    outputs = low_latency_expert_outputs([result], first_rank=rank)[0]
    combined, _, _ = buffer.low_latency_combine(outputs, idx, w, handle)
    zero_copy = buffer.get_next_low_latency_combine_buffer(handle)
    zero_copy.copy_(outputs)
    again = torch.empty_like(combined)
    buffer.low_latency_combine(zero_copy, idx, w, handle, zero_copy=True, out=again)
    return {"dispatch": result, "stats": stats, "combine": combined, "zero_copy": again, "gemm_diff": gemm_diff,
            "scale_strides": recv_x[1].stride() if s.use_fp8 else None}


def _masked_gemm(recv_x: Any, recv_count: torch.Tensor, rank: int, num_ranks: int, s: Scenario) -> float:
    """Feed the received FP8 rows to m_grouped_fp8_gemm_nt_masked; diff against dequantized operands."""
    per_rank = s.num_experts // num_ranks
    weights = gemm_weights(s, num_ranks)[rank * per_rank:(rank + 1) * per_rank]
    b = per_block_cast_to_fp8(weights)
    d = torch.full((per_rank, recv_x[0].shape[1], GEMM_N), float("nan"), dtype=torch.bfloat16)
    m_grouped_fp8_gemm_nt_masked(recv_x, b, d, recv_count, max(int(recv_count.max()), 1) if per_rank else 1)
    a_deq, b_deq = dequantize(recv_x), dequantize(b)
    worst = 0.0
    for e in range(per_rank):
        n = int(recv_count[e])
        if n:
            worst = max(worst, calc_diff(d[e, :n].float(), a_deq[e, :n] @ b_deq[e].T))
    return worst


def _mismatch(buffer: Buffer, rank: int, num_ranks: int, s: Scenario) -> Any:
    x, idx, w = scenario_inputs(s, rank, num_ranks)
    experts = s.num_experts * (2 if s.kind == "mismatch-experts" and rank == 1 else 1)
    if s.kind == "mismatch-hidden" and rank == 1:
        x = torch.cat((x, x), dim=1)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    if s.kind == "bad-arg-on-one-rank" and rank == 0:
        w = w.double()
    return buffer.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                           num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)


def _over_budget(buffer: Buffer, rank: int, num_ranks: int, s: Scenario) -> Any:
    x, idx, w = scenario_inputs(s, rank, num_ranks)
    if s.kind == "ll-over-budget":
        small = Buffer(buffer.group, 0, Buffer.get_low_latency_rdma_size_hint(s.tokens + num_ranks, s.hidden,
                                                                            num_ranks, s.num_experts) - 1)
        return small.low_latency_dispatch(x, idx, s.tokens + num_ranks, s.num_experts)
    small = Buffer(buffer.group, 1024)  # bytes: less than one rank's rows
    per_rank, _, per_expert, in_rank, _ = small.get_dispatch_layout(idx, s.num_experts)
    return small.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                          num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)


def _foreign_handle(buffer: Buffer, rank: int, num_ranks: int, s: Scenario) -> Any:
    """Rank 0 combines with the handle of another dispatch than its peers'."""
    x, idx, w = scenario_inputs(s, rank, num_ranks)
    layout = buffer.get_dispatch_layout(idx, s.num_experts)
    first = buffer.dispatch(x, num_tokens_per_rank=layout[0], is_token_in_rank=layout[3],
                            num_tokens_per_expert=layout[2], topk_idx=idx)
    other_idx = torch.where(idx >= 0, (idx + s.num_experts // num_ranks) % s.num_experts, idx)
    layout = buffer.get_dispatch_layout(other_idx, s.num_experts)
    second = buffer.dispatch(x, num_tokens_per_rank=layout[0], is_token_in_rank=layout[3],
                             num_tokens_per_expert=layout[2], topk_idx=other_idx)
    handle = first[4] if rank == 0 else second[4]
    rows = combine_rows(second[0], rank)
    if rows.shape[0] != handle.recv_src_idx.shape[0]:
        rows = combine_rows(first[0], rank)
    return buffer.combine(rows, handle)


def _die(buffer: Buffer, rank: int, num_ranks: int, s: Scenario) -> Any:
    """The last rank dies (kill) or stays away past the timeout (stall); the others dispatch."""
    if rank == num_ranks - 1:
        if s.kind == "kill":
            os._exit(17)
        time.sleep(buffer.transport.timeout.total_seconds() + 1.5)
        return "stalled"
    return _normal(buffer, rank, num_ranks, s)


RUNNERS = {"normal": _normal, "no-topk": _no_topk, "worst": _worst, "low-latency": _low_latency,
           "mismatch-experts": _mismatch, "mismatch-hidden": _mismatch, "bad-arg-on-one-rank": _mismatch,
           "over-budget": _over_budget, "ll-over-budget": _over_budget, "foreign-handle": _foreign_handle,
           "kill": _die, "stall": _die}


def run_scenarios(rank: int, num_ranks: int, group: Any, scenarios: Sequence[Scenario],
                  buffer_kwargs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The worker: one Buffer, each scenario in order; per scenario {"value"} or {"error_type", "error"},
    plus "seconds"."""
    buffer = Buffer(group, **buffer_kwargs)
    results: dict[str, dict[str, Any]] = {}
    for s in scenarios:
        start = time.perf_counter()
        try:
            results[s.name] = {"value": RUNNERS[s.kind](buffer, rank, num_ranks, s)}
        except Exception as exc:  # recorded; the oracle decides whether it was the expected error
            results[s.name] = {"error_type": type(exc).__name__, "error": str(exc)}
        results[s.name]["seconds"] = time.perf_counter() - start
    return results
