"""The oracle of the distributed Buffer scenarios: every rank's results against the
single-process contract (`simulate_*`, bit for bit where the math is the same) and the
`ep_cases.check_*` properties. Each `check_*` raises CaseFailure with the rank and the value."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..ops.ep import (COMBINE_BOUND, CombineResult, simulate_combine, simulate_dispatch, simulate_low_latency_combine,
                  simulate_low_latency_dispatch)
from ..ops.quant.fp8 import dequantize
from .checks import assert_close
from .core import CaseFailure
from .ep_buffer_scenarios import GEMM_BOUND, Scenario, combine_rows, scenario_inputs, second_tokens
from .ep_cases import (_equal_bits, check_combine, check_dispatch, check_dispatch_layout, check_low_latency_combine,
                       check_low_latency_dispatch, low_latency_expert_outputs)

#: what each error scenario must raise on every rank, and a fragment every message must hold
EXPECTED_ERRORS = {
    "mismatch-experts": ("ContractError", "'num_experts' differs"),
    "mismatch-hidden": ("ContractError", "'hidden size of x' differs"),
    "bad-arg-on-one-rank": ("ContractError", "topk_weights"),
    "over-budget": ("ContractError", "bytes of buffer"),
    "ll-over-budget": ("ContractError", "bytes of buffer"),
    "foreign-handle": ("ContractError", "'handle'"),
}


def all_inputs(s: Scenario, num_ranks: int) -> tuple[list[Any], list[torch.Tensor], list[torch.Tensor] | None]:
    xs, idx, ws = zip(*(scenario_inputs(s, r, num_ranks) for r in range(num_ranks)))
    return list(xs), list(idx), (list(ws) if s.weights else None)


def _rows(x: Any) -> torch.Tensor:
    return x[0] if isinstance(x, tuple) else x


def _same(got: Any, want: Any, what: str) -> None:
    if want is None or got is None:
        if got is not want:
            raise CaseFailure(f"{what}: {type(got).__name__}, expected {type(want).__name__}")
        return
    if isinstance(want, tuple):
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{what}[{i}]")
        return
    _equal_bits(got.cpu().contiguous(), want.cpu().contiguous(), what)


def _plain_tokens(xs: Sequence[Any]) -> list[torch.Tensor]:
    """The tokens as combine sees them: bf16, or the dequantized FP8 tokens."""
    return [dequantize(x) if isinstance(x, tuple) else x for x in xs]


def check_normal(s: Scenario, num_ranks: int, values: Sequence[dict[str, Any]]) -> float:
    xs, idx, ws = all_inputs(s, num_ranks)
    for r, v in enumerate(values):
        layout = v["layout"]
        if num_ranks <= 8 and layout[1] is not None:
            raise CaseFailure(f"rank {r}: num_tokens_per_rdma_rank should be None within one node")
        check_dispatch_layout(idx[r], s.num_experts, num_ranks, (layout[0], None, layout[2], layout[3]))
    got = [v["dispatch"] for v in values]
    check_dispatch(xs, idx, ws, s.num_experts, s.alignment, got)
    ref = simulate_dispatch(xs, idx, ws, s.num_experts, s.alignment)
    for r, (g, w) in enumerate(zip(got, ref)):
        _same(g.recv_x, w.recv_x, f"rank {r}: recv_x")
        _same(g.recv_topk_idx, w.recv_topk_idx, f"rank {r}: recv_topk_idx")
        _same(g.recv_topk_weights, w.recv_topk_weights, f"rank {r}: recv_topk_weights")
        if tuple(g.num_recv_tokens_per_expert_list) != w.num_recv_tokens_per_expert_list:
            raise CaseFailure(f"rank {r}: counts {g.num_recv_tokens_per_expert_list}, "
                              f"expected {w.num_recv_tokens_per_expert_list}")
        _same(g.handle.rank_prefix_matrix, w.handle.rank_prefix_matrix, f"rank {r}: rank_prefix_matrix")
        _same(g.handle.recv_src_idx, w.handle.recv_src_idx, f"rank {r}: recv_src_idx")
    worst = _check_combined(s, xs, idx, ws, ref, [v["combine"] for v in values])
    cached_ref = simulate_dispatch([second_tokens(s, r, num_ranks) for r in range(num_ranks)],
                                   handles=[w.handle for w in ref])
    for r, (v, w) in enumerate(zip(values, cached_ref)):
        recv_x, *rest = v["cached"]
        _same(recv_x, w.recv_x, f"rank {r}: cached recv_x")
        if any(item is not None for item in rest):
            raise CaseFailure(f"rank {r}: a cached dispatch returns (recv_x, None, None, None, None)")
    return worst


def _check_combined(s: Scenario, xs: list[Any], idx: list[torch.Tensor], ws: list[torch.Tensor] | None,
                    ref: Sequence[Any], combined: Sequence[tuple[torch.Tensor, Any]]) -> float:
    back = [combine_rows(w.recv_x, d) for d, w in enumerate(ref)]
    want = simulate_combine(back, [w.handle for w in ref], [w.recv_topk_weights for w in ref] if ws else None)
    for r, ((x, cw), w) in enumerate(zip(combined, want)):
        # the fp32 sum may run in another order than the reference's (DeepEP leaves it open)
        assert_close(x, w.combined_x.double(), COMBINE_BOUND, f"rank {r}: combined_x")
        _same(cw, w.combined_topk_weights, f"rank {r}: combined_topk_weights")
    return check_combine(_plain_tokens(xs), idx, ws, s.num_experts, [CombineResult(x, w) for x, w in combined])


def check_no_topk(s: Scenario, num_ranks: int, values: Sequence[dict[str, Any]]) -> float:
    xs, idx, _ = all_inputs(s, num_ranks)
    ref = simulate_dispatch(xs, idx, None, s.num_experts, s.alignment)
    for r, (v, w) in enumerate(zip(values, ref)):
        recv_x, recv_idx, recv_w, counts, handle = v["dispatch"]
        _same(recv_x, w.recv_x, f"rank {r}: recv_x")
        if recv_idx is not None or recv_w is not None:
            raise CaseFailure(f"rank {r}: recv_topk_idx/weights without topk_idx must be None")
        if tuple(counts) != w.num_recv_tokens_per_expert_list:
            raise CaseFailure(f"rank {r}: counts {counts}, expected {w.num_recv_tokens_per_expert_list} "
                              "(from num_tokens_per_expert)")
        _same(handle.recv_src_idx, w.handle.recv_src_idx, f"rank {r}: recv_src_idx")
    return _check_combined(s, xs, idx, None, ref, [v["combine"] for v in values])


def check_worst(s: Scenario, num_ranks: int, values: Sequence[dict[str, Any]]) -> float:
    xs, idx, ws = all_inputs(s, num_ranks)
    ref = simulate_dispatch(xs, idx, ws, s.num_experts)
    for r, (v, w) in enumerate(zip(values, ref)):
        recv_x, recv_idx, recv_w, counts, _ = v["dispatch"]
        n, worst = w.recv_topk_idx.shape[0], v["worst"]
        if _rows(recv_x).shape[0] != worst or list(counts) != []:
            raise CaseFailure(f"rank {r}: num_worst_tokens={worst} gives {_rows(recv_x).shape[0]} rows and "
                              f"counts {counts}; expected {worst} rows and []")
        _same(_rows(recv_x)[:n], _rows(w.recv_x), f"rank {r}: recv_x")
        _same(recv_idx[:n], w.recv_topk_idx, f"rank {r}: recv_topk_idx")
        if not bool((recv_idx[n:] == -1).all()):
            raise CaseFailure(f"rank {r}: padding rows of recv_topk_idx must be -1")
        _same(recv_w[:n], w.recv_topk_weights, f"rank {r}: recv_topk_weights")
    return _check_combined(s, xs, idx, ws, ref, [v["combine"] for v in values])


def check_low_latency(s: Scenario, num_ranks: int, values: Sequence[dict[str, Any]]) -> float:
    xs, idx, ws = all_inputs(s, num_ranks)
    max_tokens = s.tokens + num_ranks
    got = [v["dispatch"] for v in values]
    worst = check_low_latency_dispatch(xs, idx, s.num_experts, max_tokens, s.use_fp8, s.round_scale, got)
    ref = simulate_low_latency_dispatch(xs, idx, max_tokens, s.num_experts, s.use_fp8, s.round_scale)
    for r, (v, g, w) in enumerate(zip(values, got, ref)):
        a, b = g.sorted_by_source(), w.sorted_by_source()
        _same(a.recv_x, b.recv_x, f"rank {r}: recv_x (valid slots, source order)")
        _same(g.recv_count, w.recv_count, f"rank {r}: recv_count")
        _same(g.handle.recv_src_info, w.handle.recv_src_info, f"rank {r}: recv_src_info")
        _same(g.handle.recv_layout_range, w.handle.recv_layout_range, f"rank {r}: recv_layout_range")
        _same(v["stats"], w.recv_count, f"rank {r}: cumulative_local_expert_recv_stats")
        if s.use_fp8 and not s.use_ue8m0 and v["scale_strides"][1] != 1:
            raise CaseFailure(f"rank {r}: scales strides {v['scale_strides']}, expected MN-major (stride 1 on slots)")
        if v["gemm_diff"] is not None and v["gemm_diff"] > GEMM_BOUND:
            raise CaseFailure(f"rank {r}: masked GEMM on received rows differs by {v['gemm_diff']:.2e}")
    want = simulate_low_latency_combine(low_latency_expert_outputs(ref), idx, ws, [w.handle for w in ref])
    for r, (v, w) in enumerate(zip(values, want)):
        _same(v["combine"], w, f"rank {r}: low-latency combined_x")
        _same(v["zero_copy"], w, f"rank {r}: zero-copy combined_x")
    check_low_latency_combine(xs, idx, ws, s.use_fp8, s.round_scale, [v["combine"] for v in values])
    return worst


CHECKS = {"normal": check_normal, "no-topk": check_no_topk, "worst": check_worst, "low-latency": check_low_latency}


def check_scenario(s: Scenario, num_ranks: int, per_rank: Sequence[dict[str, Any]]) -> float:
    """per_rank[r] = rank r's record of this scenario ({"value"} or {"error_type", "error"})."""
    if s.kind in EXPECTED_ERRORS:
        kind, fragment = EXPECTED_ERRORS[s.kind]
        for r, rec in enumerate(per_rank):
            if rec.get("error_type") != kind or fragment not in rec.get("error", ""):
                raise CaseFailure(f"rank {r}: expected {kind} containing {fragment!r}, got "
                                  f"{rec.get('error_type')}: {rec.get('error', rec.get('value'))}")
        return 0.0
    for r, rec in enumerate(per_rank):
        if "error_type" in rec:
            raise CaseFailure(f"rank {r}: {rec['error_type']}: {rec['error']}")
    return CHECKS[s.kind](s, num_ranks, [rec["value"] for rec in per_rank])
