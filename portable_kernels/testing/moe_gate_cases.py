"""Conformance cases for top2_sum_gate's TileKernels extensions: softmax scoring, fixed routing
(fix_routing_mask with unmapped_topk_idx) and the routing steps after the choice (shared experts as
routed slots, logical-to-physical replicas, one TP rank's experts).

The logical choice is checked by properties (`check_gate`); the routed ids are then recomputed from
the returned unmapped_topk_idx with element loops written from the documented rules, so any
correct gate passes whatever order it ranks near-ties in."""

from __future__ import annotations

import functools

import torch

from ..ops.moe_routing import NORMALIZE_EPS, REPLICA_HASH_MULTIPLIER, TOP2_SUM_GATE, top2_sum_gate
from .checks import assert_close
from .core import Case, CaseFailure, conformance_cases
from .generators import generator, randn
from .moe_routing_cases import check_gate, gate_scores64


def _softmax_case(t: int, e: int, k: int, tg: int, g: int, with_mask: bool, seed: int, device: torch.device) -> float:
    logits, bias = randn(t, e, seed=seed, scale=2.0).to(device), randn(e, seed=seed + 1, scale=0.5).to(device)
    mask = (torch.rand(t, generator=generator(seed + 2)) > 0.2).to(device) if with_mask else None
    idx, w = top2_sum_gate(logits, bias, k, tg, g, routed_scaling_factor=1.5, scoring_func="softmax", mask=mask)
    return check_gate(logits, bias, k, tg, g, idx, w, routed_scaling_factor=1.5, scoring_func="softmax", mask=mask)


def _fixed_case(t: int, e: int, k: int, scoring: str, seed: int, device: torch.device) -> float:
    g = generator(seed)
    logits, bias = randn(t, e, seed=seed, scale=2.0), randn(e, seed=seed + 1, scale=0.1)
    fix = torch.rand(t, generator=g) < 0.5
    fixed = torch.rand(t, e, generator=g).argsort(1)[:, :k]
    unmapped = torch.where(fix[:, None], fixed, -7).to(device)  # rows not fixed are outputs only
    idx, w = top2_sum_gate(logits.to(device), bias.to(device), k, 0, 0, routed_scaling_factor=2.0,
                           scoring_func=scoring, fix_routing_mask=fix.to(device), unmapped_topk_idx=unmapped)
    if not torch.equal(idx.cpu()[fix], fixed[fix]):
        raise CaseFailure("tokens with fix_routing_mask must keep the experts in unmapped_topk_idx")
    if not torch.equal(unmapped.cpu(), idx.cpu()):
        raise CaseFailure("unmapped_topk_idx must receive the chosen logical experts")
    scores, _ = gate_scores64(logits, bias, scoring)
    chosen = scores[fix].gather(1, fixed[fix])
    want = chosen / (chosen.sum(1, keepdim=True) + NORMALIZE_EPS) * 2.0
    err = assert_close(w.cpu()[fix], want, TOP2_SUM_GATE.tolerance.dequantized, "fixed tokens' weights")
    free = ~fix
    return max(err, check_gate(logits[free], bias, k, 0, 0, idx.cpu()[free], w.cpu()[free],
                               routed_scaling_factor=2.0, scoring_func=scoring))


def _routed_ids(logical: torch.Tensor, e: int, shared: int, table: torch.Tensor | None, count: torch.Tensor | None,
                ep_rank: int, num_ep: int, tp_rank: int, tp: int) -> torch.Tensor:
    """Routed ids from logical ones by TileKernels' documented steps, one element at a time."""
    t = logical.shape[0]
    extra = 0 if table is None else table.shape[1] - 1
    per_rank = (e + extra) // num_ep
    rows = []
    for i in range(t):
        slots = logical[i].tolist()
        if slots and slots[0] >= 0:
            slots += list(range(e, e + shared))
        else:
            slots += [-1] * shared
        out = []
        for v in slots:
            if v >= 0 and table is not None:
                v = int(table[v, (ep_rank + i * REPLICA_HASH_MULTIPLIER) % int(count[v])])
            if v >= 0 and tp > 1:
                rank = v // per_rank
                v = (rank // tp) * per_rank + v % per_rank if rank % tp == tp_rank else -1
            out.append(v)
        rows.append(out)
    return torch.tensor(rows, dtype=torch.int64).view(t, logical.shape[1] + shared)


def _routing_case(t: int, e: int, k: int, tg: int, g: int, shared: int, extra: int, num_ep: int, ep_rank: int,
                  tp: int, tp_rank: int, seed: int, device: torch.device) -> float:
    gen = generator(seed)
    logits, bias = randn(t, e, seed=seed, scale=2.0), randn(e, seed=seed + 1, scale=0.1)
    mask = torch.rand(t, generator=gen) > 0.2
    table = count = None
    if extra or shared:
        physical = e + extra
        table = torch.stack([torch.randperm(physical, generator=gen)[: extra + 1] for _ in range(e + shared)])
        table = table.to(torch.int32)
        count = torch.randint(1, extra + 2, (e + shared,), generator=gen, dtype=torch.int32)
    unmapped = torch.zeros(t, k, dtype=torch.int64, device=device)
    idx, w = top2_sum_gate(logits.to(device), bias.to(device), k, tg, g, shared > 0, shared, 2.5, ep_rank, num_ep,
                           tp_rank, tp, "sigmoid", mask.to(device), None,
                           None if table is None else table.to(device), None if count is None else count.to(device),
                           unmapped)
    logical = unmapped.cpu()
    err = check_gate(logits, bias, k, tg, g, logical, w.cpu()[:, :k], routed_scaling_factor=2.5, mask=mask)
    want = _routed_ids(logical, e, shared, table, count, ep_rank, num_ep, tp_rank, tp)
    if idx.dtype != torch.int64 or not torch.equal(idx.cpu(), want):
        raise CaseFailure("routed ids differ from shared slots + replica map + TP mask applied to unmapped_topk_idx")
    shared_w = w.cpu()[:, k:]
    if shared and not torch.equal(shared_w, mask[:, None].float().expand_as(shared_w)):
        raise CaseFailure("shared-expert slots must weigh 1 (0 for masked tokens)")
    return err


SOFTMAX = [(16, 64, 8, 4, 8, False), (9, 32, 6, 0, 0, True), (5, 24, 4, 2, 3, False)]
FIXED = [(12, 32, 4, "sigmoid"), (9, 16, 3, "softmax"), (7, 24, 6, "sqrtsoftplus")]
ROUTING = [
    # t, e, k, topk_groups, groups, shared, extra, num_ep, ep_rank, tp, tp_rank
    (12, 64, 8, 4, 8, 0, 0, 4, 1, 2, 1),
    (10, 32, 4, 0, 0, 1, 32, 4, 2, 2, 0),
    (9, 16, 4, 2, 4, 2, 16, 8, 7, 4, 3),
    (8, 24, 6, 0, 0, 0, 8, 2, 0, 1, 0),
]


@conformance_cases("top2_sum_gate")
def gate_extension_cases(quick: bool) -> list[Case]:
    out = []
    for i, spec in enumerate(SOFTMAX):
        seed = 5700 + 10 * i
        out.append(Case("top2_sum_gate", "softmax T={} E={} k={} groups={}/{} mask={}".format(*spec), seed,
                        functools.partial(_softmax_case, *spec, seed)))
    for i, spec in enumerate(FIXED):
        seed = 5800 + 10 * i
        out.append(Case("top2_sum_gate", "fix_routing_mask T={} E={} k={} {}".format(*spec), seed,
                        functools.partial(_fixed_case, *spec, seed)))
    for i, spec in enumerate(ROUTING):
        seed = 5900 + 10 * i
        label = "routing T={} E={} k={} groups={}/{} shared={} extra={} ep={}/{} tp={}/{}".format(
            spec[0], spec[1], spec[2], spec[3], spec[4], spec[5], spec[6], spec[8], spec[7], spec[10], spec[9])
        out.append(Case("top2_sum_gate", label, seed, functools.partial(_routing_case, *spec, seed)))
    return out
