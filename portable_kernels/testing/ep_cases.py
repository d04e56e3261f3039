"""Conformance cases for the expert-parallel family: get_dispatch_layout against a differently
written count, and property checks of the R-rank dispatch/combine simulations.

The `check_*` functions state the contract as properties of one call's per-rank results (each
token reaches each destination once, order, remapping, counts, combine∘dispatch); they are written
independently of the reference (per source rank masks instead of one global sort) and raise
CaseFailure, so a later real implementation's per-rank results can be held to the same checks.
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch

from ..ops.ep import (COMBINE_BOUND, FP8_DISPATCH_BOUND, NO_EXPERT, CombineResult, DispatchResult,
                  LowLatencyDispatchResult, get_dispatch_layout, simulate_combine, simulate_dispatch,
                  simulate_low_latency_combine, simulate_low_latency_dispatch)
from ..layouts.constants import FP8_BLOCK_K
from ..ops.quant.fp8 import dequantize_reference, per_token_cast_to_fp8
from ..core.tensors import QuantTensor
from .checks import assert_close, assert_written
from .core import Case, CaseFailure, conformance_cases
from .generators import generator, randn

#: (num_tokens, num_topk, num_experts, num_ranks); the last quick shape is DeepSeek's top-8 scaled down
LAYOUT_QUICK = [(0, 2, 8, 2), (1, 1, 4, 4), (7, 3, 12, 3), (64, 8, 64, 8)]
LAYOUT_FULL = LAYOUT_QUICK + [(4096, 8, 256, 8), (513, 6, 160, 16), (300, 8, 288, 8)]
#: (tokens of rank 0, num_topk, num_experts, num_ranks, hidden); rank r holds tokens + r tokens
SIM_QUICK = [(0, 2, 4, 2, 128), (1, 1, 2, 1, 128), (6, 3, 12, 3, 256), (17, 4, 16, 4, 128)]
SIM_FULL = SIM_QUICK + [(128, 8, 64, 8, 512), (60, 6, 48, 6, 384)]
#: share of top-k entries replaced by "no expert"
DROP_RATE = 0.2


def random_routing(num_tokens: int, num_topk: int, num_experts: int, seed: int,
                   device: torch.device | str = "cpu", dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Distinct random experts per token, about DROP_RATE of entries -1, and the last token
    (when there are two or more) routed nowhere."""
    g = generator(seed)
    idx = torch.rand(num_tokens, num_experts, generator=g).topk(min(num_topk, num_experts), dim=1).indices
    idx = torch.cat((idx, torch.full((num_tokens, num_topk - idx.shape[1]), NO_EXPERT)), dim=1)
    idx[torch.rand(idx.shape, generator=g) < DROP_RATE] = NO_EXPERT
    if num_tokens >= 2:
        idx[-1] = NO_EXPERT
    return idx.to(dtype=dtype, device=device)


def _ep_inputs(tokens: int, num_topk: int, num_experts: int, num_ranks: int, hidden: int, seed: int,
               device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    sizes = [tokens + r for r in range(num_ranks)]
    xs = [randn(n, hidden, seed=seed + 10 * r, dtype=torch.bfloat16, device=device) for r, n in enumerate(sizes)]
    idx = [random_routing(n, num_topk, num_experts, seed + 10 * r + 1, device) for r, n in enumerate(sizes)]
    weights = [randn(n, num_topk, seed=seed + 10 * r + 2, device=device).abs() for r, n in enumerate(sizes)]
    return xs, idx, weights


def _owns(idx: torch.Tensor, rank: int, per_rank: int) -> torch.Tensor:
    """[T, k] bool: entries naming an expert of `rank`."""
    return (idx >= rank * per_rank) & (idx < (rank + 1) * per_rank)


#: integer dtype of each float width, to compare floats (fp8 included) bit for bit
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _equal_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Same dtype, shape and bits (so -0.0 differs from 0.0 and fp8 compares without arithmetic)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise CaseFailure(f"{what}: {a.dtype} {tuple(a.shape)}, expected {b.dtype} {tuple(b.shape)}")
    a, b = a.cpu(), b.cpu()
    if a.dtype.is_floating_point:
        a, b = a.view(_BITS[a.element_size()]), b.view(_BITS[b.element_size()])
    if not torch.equal(a, b):
        raise CaseFailure(f"{what}: {int((a != b).sum())} of {a.numel()} elements differ")


# --------------------------------------------------------------------------------------------
# Property checks (usable on any implementation's per-rank results)
# --------------------------------------------------------------------------------------------

def check_dispatch_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int, got: Sequence) -> None:
    """get_dispatch_layout's outputs, counted one rank and one expert at a time."""
    per_rank = num_experts // num_ranks
    idx = topk_idx.cpu().long()
    in_rank = torch.stack([_owns(idx, r, per_rank).any(dim=1) for r in range(num_ranks)], dim=1)
    per_expert = (idx[..., None] == torch.arange(num_experts)).sum(dim=(0, 1))
    tokens_per_rank, rdma, tokens_per_expert, is_token_in_rank = got
    if rdma is not None:
        raise CaseFailure("num_tokens_per_rdma_rank: expected None (intranode contract)")
    _equal_bits(is_token_in_rank.cpu(), in_rank, "is_token_in_rank")
    _equal_bits(tokens_per_rank.cpu(), in_rank.sum(dim=0).to(torch.int32), "num_tokens_per_rank")
    _equal_bits(tokens_per_expert.cpu(), per_expert.to(torch.int32), "num_tokens_per_expert")


def expected_sources(topk_idx: Sequence[torch.Tensor], rank: int, per_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(source rank, source token) of every row rank `rank` must receive in normal mode, in order."""
    ranks, tokens = [], []
    for s, idx in enumerate(topk_idx):
        t = _owns(idx.cpu().long(), rank, per_rank).any(dim=1).nonzero().flatten()
        ranks.append(torch.full_like(t, s))
        tokens.append(t)
    return torch.cat(ranks), torch.cat(tokens)


def check_dispatch(xs: Sequence, topk_idx: Sequence[torch.Tensor], topk_weights: Sequence[torch.Tensor] | None,
                   num_experts: int, expert_alignment: int, results: Sequence[DispatchResult]) -> None:
    """Each token reaches each destination rank once, ordered by (source rank, token); rows carry the
    token's bytes; topk_idx remapped to local ids (-1 elsewhere, weight 0 there); counts aligned."""
    num_ranks = len(xs)
    per_rank = num_experts // num_ranks
    fp8 = isinstance(xs[0], (tuple, list))
    for d, res in enumerate(results):
        src_rank, src_tok = expected_sources(topk_idx, d, per_rank)
        h = res.handle
        _equal_bits(h.recv_src_rank.cpu().long(), src_rank, f"rank {d}: source ranks of received rows")
        _equal_bits(h.recv_src_idx.cpu().long(), src_tok, f"rank {d}: source tokens of received rows")
        parts = [(x[0] if fp8 else x).cpu() for x in xs]
        want = torch.cat([parts[s][src_tok[src_rank == s]] for s in range(num_ranks)])
        got = res.recv_x[0] if fp8 else res.recv_x
        _equal_bits(got.cpu(), want, f"rank {d}: recv_x")
        if fp8:
            scales = torch.cat([xs[s][1].cpu()[src_tok[src_rank == s]] for s in range(num_ranks)])
            _equal_bits(res.recv_x[1].cpu(), scales, f"rank {d}: recv_x scales")
        idx = torch.cat([topk_idx[s].cpu()[src_tok[src_rank == s]] for s in range(num_ranks)])
        local = _owns(idx.long(), d, per_rank)
        _equal_bits(res.recv_topk_idx.cpu(), torch.where(local, idx - d * per_rank, NO_EXPERT).to(idx.dtype),
                    f"rank {d}: recv_topk_idx")
        if topk_weights is not None:
            w = torch.cat([topk_weights[s].cpu()[src_tok[src_rank == s]] for s in range(num_ranks)])
            _equal_bits(res.recv_topk_weights.cpu(), torch.where(local, w, 0.0), f"rank {d}: recv_topk_weights")
        counts = [int((res.recv_topk_idx == e).sum()) for e in range(per_rank)]
        aligned = [-(-c // expert_alignment) * expert_alignment for c in counts]
        if list(res.num_recv_tokens_per_expert_list) != aligned:
            raise CaseFailure(f"rank {d}: num_recv_tokens_per_expert_list {res.num_recv_tokens_per_expert_list}, "
                              f"expected {aligned} (counts {counts} aligned to {expert_alignment})")
        ends = h.rank_prefix_matrix[:, d].cpu().long()
        if not torch.equal(ends, torch.bincount(src_rank, minlength=num_ranks).cumsum(0)):
            raise CaseFailure(f"rank {d}: rank_prefix_matrix column {ends.tolist()} does not match the rows received")


def combine_factor(topk_idx: torch.Tensor, num_experts: int, num_ranks: int) -> torch.Tensor:
    """fp64 [T]: Σ (d + 1) over the distinct destination ranks d of each token (0 if none)."""
    per_rank = num_experts // num_ranks
    idx = topk_idx.cpu().long()
    factor = torch.zeros(idx.shape[0], dtype=torch.float64)
    for d in range(num_ranks):
        factor += (d + 1) * _owns(idx, d, per_rank).any(dim=1).double()
    return factor


def check_combine(xs: Sequence[torch.Tensor], topk_idx: Sequence[torch.Tensor],
                  topk_weights: Sequence[torch.Tensor] | None, num_experts: int,
                  results: Sequence[CombineResult]) -> float:
    """combine∘dispatch when every rank d returned its received rows times (d + 1) and its
    recv_topk_weights unchanged: token t of rank s gets x[t] · combine_factor (0 when sent
    nowhere) and its weights back where it chose an expert, 0 elsewhere. Returns the worst diff."""
    worst = 0.0
    for s, res in enumerate(results):
        assert_written(res.combined_x, f"rank {s}: combined_x")
        ref = xs[s].cpu().double() * combine_factor(topk_idx[s], num_experts, len(xs))[:, None]
        worst = max(worst, assert_close(res.combined_x, ref, COMBINE_BOUND, f"rank {s}: combined_x"))
        if topk_weights is not None:
            want = torch.where(topk_idx[s].cpu() >= 0, topk_weights[s].cpu(), 0.0)
            _equal_bits(res.combined_topk_weights.cpu(), want, f"rank {s}: combined_topk_weights")
        elif res.combined_topk_weights is not None:
            raise CaseFailure(f"rank {s}: combined_topk_weights without topk_weights")
    return worst


def _per_token_fp8(x: torch.Tensor, round_scale: bool) -> QuantTensor:
    return per_token_cast_to_fp8(x, gran_k=FP8_BLOCK_K, use_ue8m0=round_scale)


def check_low_latency_dispatch(xs: Sequence[torch.Tensor], topk_idx: Sequence[torch.Tensor], num_experts: int,
                               num_max_dispatch_tokens_per_rank: int, use_fp8: bool, round_scale: bool,
                               results: Sequence[LowLatencyDispatchResult]) -> float:
    """One copy per (token, expert): recv_count right, layout ranges disjoint and covering exactly
    the valid slots, and (in source order) each slot holds its token's bytes — the bf16 row, or its
    per-token FP8 cast. Returns the worst calc_diff of FP8 rows against the bf16 tokens (0 for bf16)."""
    num_ranks = len(xs)
    per_rank = num_experts // num_ranks
    num_slots = num_max_dispatch_tokens_per_rank * num_ranks
    tokens = torch.cat([x.cpu() for x in xs])
    starts = torch.tensor([0] + [x.shape[0] for x in xs[:-1]]).cumsum(0)
    cast = _per_token_fp8(tokens, round_scale) if use_fp8 else None
    worst = 0.0
    for d, res in enumerate(results):
        h = res.handle
        data = res.recv_x[0] if use_fp8 else res.recv_x
        if tuple(data.shape) != (per_rank, num_slots, xs[0].shape[1]):
            raise CaseFailure(f"rank {d}: recv_x of shape {tuple(data.shape)}, expected "
                              f"{(per_rank, num_slots, xs[0].shape[1])}")
        slots = torch.arange(num_slots)
        begin, count = h.range_begin.cpu(), h.range_count.cpu()
        member = (slots >= begin[..., None]) & (slots < (begin + count)[..., None])
        recv_count = res.recv_count.cpu().long()
        if bool((member.sum(dim=1) > 1).any()) or not torch.equal(member.any(dim=1), slots < recv_count[:, None]):
            raise CaseFailure(f"rank {d}: recv_layout_range {h.recv_layout_range.tolist()} does not tile the "
                              f"first recv_count = {recv_count.tolist()} slots of each expert")
        # expected (expert, source rank, token) triples, one source rank at a time
        experts = torch.arange(d * per_rank, (d + 1) * per_rank)
        parts = []
        for s in range(num_ranks):
            hits = (topk_idx[s].cpu().long()[:, :, None] == experts).any(dim=1)  # [T_s, L]
            e, t = hits.T.nonzero(as_tuple=True)
            parts.append(torch.stack((e, torch.full_like(e, s), t)))
        triples = torch.cat(parts, dim=1)
        e, src, tok = triples[:, torch.sort(triples[0], stable=True).indices]  # by expert, then source
        per_expert = torch.bincount(e, minlength=per_rank)
        if not torch.equal(recv_count, per_expert):
            raise CaseFailure(f"rank {d}: recv_count {recv_count.tolist()}, expected {per_expert.tolist()}")
        pos = torch.arange(e.numel()) - (per_expert.cumsum(0) - per_expert)[e]
        canon = res.sorted_by_source()
        _equal_bits(canon.handle.recv_src_rank.cpu()[e, pos].long(), src, f"rank {d}: source ranks")
        _equal_bits(canon.handle.recv_src_info.cpu()[e, pos].long(), tok, f"rank {d}: source tokens")
        rows = starts[src] + tok
        if not use_fp8:
            _equal_bits(canon.recv_x.cpu()[e, pos], tokens[rows], f"rank {d}: rows")
            continue
        got_data, got_scale = canon.recv_x[0].cpu()[e, pos], canon.recv_x[1].cpu()[e, pos]
        _equal_bits(got_data, cast.data[rows], f"rank {d}: fp8 rows")
        _equal_bits(got_scale, cast.scale[rows], f"rank {d}: scales")
        if rows.numel():
            deq = dequantize_reference(QuantTensor(got_data, got_scale, (1, FP8_BLOCK_K)))
            worst = max(worst, assert_close(deq, tokens[rows].double(), FP8_DISPATCH_BOUND,
                                            f"rank {d}: fp8 rows vs tokens"))
    return worst


def low_latency_expert_outputs(results: Sequence[LowLatencyDispatchResult], poison_unused: bool = True,
                               first_rank: int = 0) -> list[torch.Tensor]:
    """Per rank bf16 [L, M*R, H]: each valid slot's (dequantized) row times (global expert id + 1),
    unused slots NaN, so a combine that reads them shows. results[i] is rank first_rank + i."""
    outs = []
    for d, res in enumerate(results, start=first_rank):
        if isinstance(res.recv_x, tuple):
            data, scale = res.recv_x
            rows = dequantize_reference(QuantTensor(data, scale, (1, FP8_BLOCK_K)))
        else:
            rows = res.recv_x.float()
        per_rank = rows.shape[0]
        expert = torch.arange(d * per_rank, (d + 1) * per_rank, device=rows.device)
        out = (rows * (expert + 1).float()[:, None, None]).bfloat16()
        if poison_unused:
            unused = torch.arange(rows.shape[1], device=rows.device) >= res.recv_count[:, None]
            out[unused] = float("nan")
        outs.append(out)
    return outs


def check_low_latency_combine(xs: Sequence[torch.Tensor], topk_idx: Sequence[torch.Tensor],
                              topk_weights: Sequence[torch.Tensor], use_fp8: bool, round_scale: bool,
                              combined: Sequence[torch.Tensor]) -> float:
    """The weighted sum over each token's experts of what `low_latency_expert_outputs` returned
    for it: Σ_j w_j · bf16(x̂ · (e_j + 1)) over the entries with an expert (fp64 reference,
    x̂ the dequantized per-token FP8 cast with use_fp8). Returns the worst diff."""
    worst = 0.0
    for s, out in enumerate(combined):
        assert_written(out, f"rank {s}: combined_x")
        x = dequantize_reference(_per_token_fp8(xs[s], round_scale)) if use_fp8 else xs[s].float()
        x = x.cpu()
        idx, w = topk_idx[s].cpu().long(), topk_weights[s].cpu().double()
        ref = torch.zeros(x.shape, dtype=torch.float64)
        for j in range(idx.shape[1]):
            chosen = idx[:, j] >= 0
            value = (x * (idx[:, j] + 1).float()[:, None]).bfloat16().double()
            ref += torch.where(chosen[:, None], value * w[:, j:j + 1], 0.0)
        worst = max(worst, assert_close(out, ref, COMBINE_BOUND, f"rank {s}: combined_x"))
    return worst


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------

def _layout_case(tokens, num_topk, num_experts, num_ranks, dtype, seed, device) -> float:
    idx = random_routing(tokens, num_topk, num_experts, seed, device, dtype)
    check_dispatch_layout(idx, num_experts, num_ranks, get_dispatch_layout(idx, num_experts, num_ranks))
    return 0.0


@conformance_cases("get_dispatch_layout")
def layout_cases(quick: bool) -> list[Case]:
    cases = []
    for i, (t, k, e, r) in enumerate(LAYOUT_QUICK if quick else LAYOUT_FULL):
        for dtype in (torch.int64, torch.int32):
            seed = 5000 + 10 * i
            run = functools.partial(_layout_case, t, k, e, r, dtype, seed)
            cases.append(Case("get_dispatch_layout", f"T={t} k={k} E={e} R={r} {str(dtype)[6:]}", seed, run))
    return cases


def _dispatch_case(shape, form: str, alignment: int, seed: int, device: torch.device) -> float:
    tokens, num_topk, num_experts, num_ranks, hidden = shape
    xs, idx, weights = _ep_inputs(tokens, num_topk, num_experts, num_ranks, hidden, seed, device)
    if form == "fp8":
        xs = [tuple(_per_token_fp8(x, False)) for x in xs]
    if form == "no-weights":
        weights = None
    results = simulate_dispatch(xs, idx, weights, num_experts, alignment)
    check_dispatch(xs, idx, weights, num_experts, alignment, results)
    if form == "cached":
        again = [randn(*x.shape, seed=seed + 99, dtype=torch.bfloat16, device=device) for x in xs]
        cached = simulate_dispatch(again, handles=[r.handle for r in results])
        for d, (res, first) in enumerate(zip(cached, results)):
            parts = torch.cat(again)
            starts = torch.tensor([0] + [x.shape[0] for x in again]).cumsum(0)
            rows = starts[first.handle.recv_src_rank.long()] + first.handle.recv_src_idx.long()
            _equal_bits(res.recv_x.cpu(), parts.cpu()[rows.cpu()], f"rank {d}: cached recv_x")
    return 0.0


@conformance_cases("simulate_dispatch")
def dispatch_cases(quick: bool) -> list[Case]:
    cases = []
    for i, shape in enumerate(SIM_QUICK if quick else SIM_FULL):
        for form, alignment in (("bf16", 1), ("fp8", 128), ("no-weights", 4), ("cached", 1)):
            seed = 5200 + 10 * i
            run = functools.partial(_dispatch_case, shape, form, alignment, seed)
            cases.append(Case("simulate_dispatch", f"T,k,E,R,H={shape} {form} align={alignment}", seed, run))
    return cases


def _combine_case(shape, with_weights: bool, seed: int, device: torch.device) -> float:
    tokens, num_topk, num_experts, num_ranks, hidden = shape
    xs, idx, weights = _ep_inputs(tokens, num_topk, num_experts, num_ranks, hidden, seed, device)
    weights = weights if with_weights else None
    sent = simulate_dispatch(xs, idx, weights, num_experts)
    back = [(r.recv_x.float() * (d + 1)).bfloat16() for d, r in enumerate(sent)]
    recv_w = [r.recv_topk_weights for r in sent] if with_weights else None
    combined = simulate_combine(back, [r.handle for r in sent], recv_w)
    return check_combine(xs, idx, weights, num_experts, combined)


@conformance_cases("simulate_combine")
def combine_cases(quick: bool) -> list[Case]:
    cases = []
    for i, shape in enumerate(SIM_QUICK if quick else SIM_FULL):
        for with_weights in (True, False):
            seed = 5400 + 10 * i
            run = functools.partial(_combine_case, shape, with_weights, seed)
            cases.append(Case("simulate_combine", f"T,k,E,R,H={shape} weights={with_weights}", seed, run))
    return cases


def _ll_inputs(shape, seed, device):
    tokens, num_topk, num_experts, num_ranks, hidden = shape
    xs, idx, weights = _ep_inputs(tokens, num_topk, num_experts, num_ranks, hidden, seed, device)
    max_tokens = tokens + num_ranks  # room beyond the largest rank's tokens: unused slots exist
    return xs, idx, weights, max_tokens


def _ll_dispatch_case(shape, use_fp8: bool, round_scale: bool, seed: int, device: torch.device) -> float:
    xs, idx, _, max_tokens = _ll_inputs(shape, seed, device)
    num_experts = shape[2]
    results = simulate_low_latency_dispatch(xs, idx, max_tokens, num_experts, use_fp8, round_scale)
    return check_low_latency_dispatch(xs, idx, num_experts, max_tokens, use_fp8, round_scale, results)


LL_FORMS = ((False, False), (True, False), (True, True))


@conformance_cases("simulate_low_latency_dispatch")
def low_latency_dispatch_cases(quick: bool) -> list[Case]:
    cases = []
    for i, shape in enumerate(SIM_QUICK if quick else SIM_FULL):
        for use_fp8, round_scale in LL_FORMS:
            seed = 5600 + 10 * i
            run = functools.partial(_ll_dispatch_case, shape, use_fp8, round_scale, seed)
            cases.append(Case("simulate_low_latency_dispatch",
                              f"T,k,E,R,H={shape} fp8={use_fp8} round_scale={round_scale}", seed, run))
    return cases


def _ll_combine_case(shape, use_fp8: bool, round_scale: bool, seed: int, device: torch.device) -> float:
    xs, idx, weights, max_tokens = _ll_inputs(shape, seed, device)
    results = simulate_low_latency_dispatch(xs, idx, max_tokens, shape[2], use_fp8, round_scale)
    outs = low_latency_expert_outputs(results)
    combined = simulate_low_latency_combine(outs, idx, weights, [r.handle for r in results])
    return check_low_latency_combine(xs, idx, weights, use_fp8, round_scale, combined)


@conformance_cases("simulate_low_latency_combine")
def low_latency_combine_cases(quick: bool) -> list[Case]:
    cases = []
    for i, shape in enumerate(SIM_QUICK if quick else SIM_FULL):
        for use_fp8, round_scale in LL_FORMS:
            seed = 5800 + 10 * i
            run = functools.partial(_ll_combine_case, shape, use_fp8, round_scale, seed)
            cases.append(Case("simulate_low_latency_combine",
                              f"T,k,E,R,H={shape} fp8={use_fp8} round_scale={round_scale}", seed, run))
    return cases
