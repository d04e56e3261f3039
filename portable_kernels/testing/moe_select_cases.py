"""Conformance cases for TileKernels' selection, count and expert-id ops: topk_gate,
topk_sum_and_topk_group_idx, group_count, aux_fi, mask_indices_by_tp, inplace_unique_group_indices,
map_to_physical_experts. Each result is exact, so it is compared with an independent computation
(element loops or closed forms, not the references' code path), on random and tie-heavy inputs."""

from __future__ import annotations

import functools

import torch

from ..ops.moe_routing import (AUX_FI, REPLICA_HASH_MULTIPLIER, aux_fi, group_count, inplace_unique_group_indices,
                           map_to_physical_experts, mask_indices_by_tp, topk_gate, topk_sum_and_topk_group_idx)
from .checks import assert_close
from .core import Case, CaseFailure, conformance_cases
from .generators import generator, randn
from .moe_routing_cases import random_topk_idx


def _expect_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> float:
    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        raise CaseFailure(f"{what}: {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}")
    if not torch.equal(got.cpu(), want):
        bad = (got.cpu() != want).nonzero()[0].tolist()
        raise CaseFailure(f"{what}: differs at {bad}: {got.cpu()[tuple(bad)]} vs {want[tuple(bad)]}")
    return 0.0


def _ranked(rows: torch.Tensor, k: int) -> torch.Tensor:
    """Best k of each row by a per-row Python sort on (-value, index): the stable order, spelled out."""
    out = [sorted(range(len(r)), key=lambda j: (-r[j], j))[:k] for r in rows.tolist()]
    return torch.tensor(out, dtype=torch.int64).view(len(out), k)


def _scores(t: int, e: int, tied: bool, seed: int) -> torch.Tensor:
    if tied:  # few distinct values: most comparisons are ties the smaller index must win
        return torch.randint(0, 4, (t, e), generator=generator(seed)).float()
    return randn(t, e, seed=seed)


def _topk_gate_case(t: int, e: int, k: int, tied: bool, seed: int, device: torch.device) -> float:
    scores = _scores(t, e, tied, seed)
    return _expect_equal(topk_gate(scores.to(device), k), _ranked(scores, k), "topk_idx")


def _group_case(t: int, g: int, p: int, n: int, kg: int, tied: bool, seed: int, device: torch.device) -> float:
    scores = _scores(t, g * p, tied, seed).view(t, g, p)
    sums = scores.sort(dim=-1, descending=True).values[..., :n].sum(-1)  # integers or n <= 2: exact in any order
    return _expect_equal(topk_sum_and_topk_group_idx(scores.to(device), n, kg), _ranked(sums, kg), "group idx")


def _count_case(op: str, t: int, k: int, e: int, aux: int, seed: int, device: torch.device) -> float:
    idx = random_topk_idx(t, k, e, seed, 0.2) if t else torch.empty(0, k, dtype=torch.int64)
    counts = torch.zeros(e, dtype=torch.int64)
    for v in idx.flatten().tolist():
        if v >= 0:
            counts[v] += 1
    if op == "group_count":
        return _expect_equal(group_count(idx.to(device), e), counts.to(torch.int32), "group_count")
    fi = aux_fi(idx.to(device), e, aux)
    want = counts.double() * e / (t * aux) if t else torch.zeros(e, dtype=torch.float64)
    if fi.dtype != torch.float32 or tuple(fi.shape) != (e,):
        raise CaseFailure(f"aux_fi: {fi.dtype} {tuple(fi.shape)}, expected float32 ({e},)")
    if not t:
        return _expect_equal(fi, torch.zeros(e), "aux_fi with no tokens")
    return assert_close(fi, want, AUX_FI.tolerance.dequantized, "aux_fi vs fp64")


def _mask_tp_case(t: int, k: int, per_rank: int, ep: int, tp: int, tp_rank: int, dtype: torch.dtype, seed: int,
                  device: torch.device) -> float:
    n = per_rank * ep
    idx = random_topk_idx(t, k, n, seed, 0.2).to(dtype)
    want = torch.full_like(idx, -1)
    for (i, j), v in zip(torch.cartesian_prod(torch.arange(t), torch.arange(k)).tolist(), idx.flatten().tolist()):
        rank = v // per_rank
        if v >= 0 and rank % tp == tp_rank:
            want[i, j] = (rank // tp) * per_rank + v % per_rank
    return _expect_equal(mask_indices_by_tp(idx.to(device), n, ep, tp_rank, tp), want, "masked indices")


def _unique_case(t: int, k: int, g: int, seed: int, device: torch.device) -> float:
    ids = torch.randint(-1, g, (t, k), generator=generator(seed))
    want = ids.clone()
    for row in want:
        seen = set()
        for j, v in enumerate(row.tolist()):
            if v in seen:
                row[j] = -1
            seen.add(v)
    got = ids.to(device)
    if inplace_unique_group_indices(got, g) is not None:
        raise CaseFailure("inplace_unique_group_indices must return None (it works in place)")
    return _expect_equal(got, want, "group indices")


def _physical_case(t: int, k: int, logical: int, replicas: int, ep_rank: int, seed: int, device: torch.device) -> float:
    g = generator(seed)
    idx = random_topk_idx(t, k, logical, seed, 0.2)
    table = torch.randperm(logical * replicas, generator=g).view(logical, replicas).to(torch.int32)
    count = torch.randint(1, replicas + 1, (logical,), generator=g, dtype=torch.int32)
    want = torch.full_like(idx, -1)
    for i in range(t):
        for j in range(k):
            v = int(idx[i, j])
            if v >= 0:
                want[i, j] = int(table[v, (ep_rank + i * REPLICA_HASH_MULTIPLIER) % int(count[v])])
    got = map_to_physical_experts(idx.to(device), table.to(device), count.to(device), ep_rank)
    return _expect_equal(got, want, "physical ids")


@conformance_cases("topk_gate")
def topk_gate_cases(quick: bool) -> list[Case]:
    specs = [(9, 72, 6, False), (5, 16, 16, False), (7, 32, 6, True), (0, 8, 2, False)]
    if not quick:
        specs += [(4001, 256, 8, False), (512, 144, 6, True)]
    return [Case("topk_gate", f"T={t} E={e} k={k} tied={tied}", 7300 + i,
                 functools.partial(_topk_gate_case, t, e, k, tied, 7300 + i))
            for i, (t, e, k, tied) in enumerate(specs)]


@conformance_cases("topk_sum_and_topk_group_idx")
def group_select_cases(quick: bool) -> list[Case]:
    specs = [(9, 8, 9, 2, 4, False), (6, 4, 18, 1, 2, False), (7, 8, 4, 2, 3, True), (5, 4, 6, 3, 2, True),
             (0, 8, 4, 2, 4, False)]
    if not quick:
        specs.append((4001, 8, 32, 2, 4, False))
    return [Case("topk_sum_and_topk_group_idx", f"T={t} G={g} P={p} n={n} kg={kg} tied={tied}", 7400 + i,
                 functools.partial(_group_case, t, g, p, n, kg, tied, 7400 + i))
            for i, (t, g, p, n, kg, tied) in enumerate(specs)]


@conformance_cases("group_count")
def group_count_cases(quick: bool) -> list[Case]:
    specs = [(37, 8, 32, 8), (5, 2, 3, 1), (0, 4, 8, 4)] + ([] if quick else [(4001, 8, 256, 8)])
    return [Case("group_count", f"T={t} k={k} groups={e}", 7500 + i,
                 functools.partial(_count_case, "group_count", t, k, e, a, 7500 + i))
            for i, (t, k, e, a) in enumerate(specs)]


@conformance_cases("aux_fi")
def aux_fi_cases(quick: bool) -> list[Case]:
    specs = [(37, 8, 32, 8), (11, 6, 72, 1), (0, 4, 8, 4)] + ([] if quick else [(4001, 9, 256, 9)])
    return [Case("aux_fi", f"T={t} k={k} E={e} num_aux_topk={a}", 7550 + i,
                 functools.partial(_count_case, "aux_fi", t, k, e, a, 7550 + i))
            for i, (t, k, e, a) in enumerate(specs)]


@conformance_cases("mask_indices_by_tp")
def mask_tp_cases(quick: bool) -> list[Case]:
    specs = [(13, 6, 9, 8, 2, 1, torch.int64), (9, 8, 4, 8, 4, 3, torch.int32), (7, 2, 5, 4, 1, 0, torch.int64),
             (0, 4, 2, 4, 2, 0, torch.int64)]
    if not quick:
        specs.append((4001, 8, 4, 64, 8, 5, torch.int64))
    return [Case("mask_indices_by_tp", f"T={t} k={k} per_rank={p} ep={ep} tp={tp} tp_rank={r} {str(d)[6:]}",
                 7600 + i, functools.partial(_mask_tp_case, t, k, p, ep, tp, r, d, 7600 + i))
            for i, (t, k, p, ep, tp, r, d) in enumerate(specs)]


@conformance_cases("inplace_unique_group_indices")
def unique_cases(quick: bool) -> list[Case]:
    specs = [(17, 8, 8), (9, 6, 3), (0, 4, 4)] + ([] if quick else [(4001, 9, 72)])
    return [Case("inplace_unique_group_indices", f"T={t} k={k} groups={g}", 7700 + i,
                 functools.partial(_unique_case, t, k, g, 7700 + i)) for i, (t, k, g) in enumerate(specs)]


@conformance_cases("map_to_physical_experts")
def physical_cases(quick: bool) -> list[Case]:
    specs = [(13, 6, 18, 3, 0), (9, 8, 10, 2, 5), (5, 2, 4, 1, 1), (0, 4, 8, 2, 0)]
    if not quick:
        specs.append((512, 9, 258, 33, 3))
    return [Case("map_to_physical_experts", f"T={t} k={k} logical={lc} replicas={r} ep_rank={ep}", 7800 + i,
                 functools.partial(_physical_case, t, k, lc, r, ep, 7800 + i))
            for i, (t, k, lc, r, ep) in enumerate(specs)]
