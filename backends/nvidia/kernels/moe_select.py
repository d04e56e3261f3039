"""The gate's stable selections in Triton (TileKernels' `topk_gate` and
`topk_sum_and_topk_group_idx`): exact indices, best first, equal values to the smaller index.

A program takes BLOCK_T tokens x all experts (or groups x experts per group); every ranking is an
iterated arg-max that takes the smallest index among equal values and then removes that one entry
(-0.0 and 0.0 are equal, as in torch's sort). A group's score is its num_topk_sum best scores
added best first, left to right in fp32 — the reference's order, so the group ranking is its own.
Scores are finite (the public ops check it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import serialized

#: tokens per program
BLOCK_T = 8
#: the widest row (experts, or groups x experts per group, padded to powers of two) one program holds
MAX_ROW = 4096


@triton.jit
def _first_max(values, ids, sentinel, AXIS: tl.constexpr):
    """(max along AXIS, the smallest id holding it)."""
    best = tl.max(values, axis=AXIS)
    at = tl.min(tl.where(values == tl.expand_dims(best, AXIS), ids, sentinel), axis=AXIS)
    return best, at


@triton.jit
def topk_gate_kernel(scores_ptr, out_ptr, T, E, stride_t, stride_e, K: tl.constexpr, E_POW2: tl.constexpr,
                     K_POW2: tl.constexpr, BLOCK_T: tl.constexpr, UNIT: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tokens < T
    experts = tl.arange(0, E_POW2)
    cols = experts if UNIT else experts * stride_e  # UNIT: a unit stride the compiler sees (vector loads)
    x = tl.load(scores_ptr + tokens[:, None].to(tl.int64) * stride_t + cols[None, :],
                mask=tmask[:, None] & (experts[None, :] < E), other=float("-inf"))
    slots = tl.arange(0, K_POW2)
    chosen = tl.zeros((BLOCK_T, K_POW2), tl.int64)
    for k in tl.static_range(K):
        _, at = _first_max(x, experts[None, :], E_POW2, 1)
        x = tl.where(experts[None, :] == at[:, None], float("-inf"), x)
        chosen = tl.where(slots[None, :] == k, at[:, None].to(tl.int64), chosen)
    tl.store(out_ptr + tokens[:, None].to(tl.int64) * K + slots[None, :], chosen,
             mask=tmask[:, None] & (slots[None, :] < K))


@triton.jit
def group_select_kernel(scores_ptr, out_ptr, T, G, P, stride_t, stride_g, stride_p, N: tl.constexpr,
                        KG: tl.constexpr, G_POW2: tl.constexpr, P_POW2: tl.constexpr, KG_POW2: tl.constexpr,
                        BLOCK_T: tl.constexpr, UNIT: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tokens < T
    groups = tl.arange(0, G_POW2)
    members = tl.arange(0, P_POW2)
    m = tmask[:, None, None] & (groups[None, :, None] < G) & (members[None, None, :] < P)
    cols = members if UNIT else members * stride_p
    x = tl.load(scores_ptr + tokens[:, None, None].to(tl.int64) * stride_t + groups[None, :, None] * stride_g
                + cols[None, None, :], mask=m, other=float("-inf"))
    total = tl.zeros((BLOCK_T, G_POW2), tl.float32)
    for j in tl.static_range(N):  # the N best of each group, added best first (the reference's order)
        best, at = _first_max(x, members[None, None, :], P_POW2, 2)
        x = tl.where(members[None, None, :] == at[:, :, None], float("-inf"), x)
        if j == 0:
            total = best
        else:
            total = total + best
    total = tl.where(groups[None, :] < G, total, float("-inf"))
    slots = tl.arange(0, KG_POW2)
    chosen = tl.zeros((BLOCK_T, KG_POW2), tl.int64)
    for k in tl.static_range(KG):
        _, at = _first_max(total, groups[None, :], G_POW2, 1)
        total = tl.where(groups[None, :] == at[:, None], float("-inf"), total)
        chosen = tl.where(slots[None, :] == k, at[:, None].to(tl.int64), chosen)
    tl.store(out_ptr + tokens[:, None].to(tl.int64) * KG + slots[None, :], chosen,
             mask=tmask[:, None] & (slots[None, :] < KG))


def fits(row: int) -> bool:
    """Whether a row of `row` scores (padded to a power of two) fits one program."""
    return triton.next_power_of_2(max(row, 1)) <= MAX_ROW


@serialized
def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """scores fp32 [T, E] (any strides) -> int64 [T, num_topk] contiguous."""
    op = "topk_gate"
    _checks.tensor(op, "scores", scores, (torch.float32,), (None, None))
    t, e = scores.shape
    if isinstance(num_topk, bool) or not isinstance(num_topk, int) or not 1 <= num_topk <= e:
        _checks.fail(op, "num_topk", repr(num_topk), f"an int in [1, {e}]", "choose at most E experts")
    if not fits(e):
        _checks.fail(op, "scores", f"{e} experts", f"at most {MAX_ROW} per row", "use the layout-reference provider")
    out = torch.empty(t, num_topk, dtype=torch.int64, device=scores.device)
    if t:
        topk_gate_kernel[(triton.cdiv(t, BLOCK_T),)](scores, out, t, e, scores.stride(0), scores.stride(1),
                                                     K=num_topk, E_POW2=triton.next_power_of_2(e),
                                                     K_POW2=triton.next_power_of_2(num_topk), BLOCK_T=BLOCK_T,
                                                     UNIT=scores.stride(1) == 1)
    return out


@serialized
def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """scores fp32 [T, G, P] (any strides) -> int64 [T, num_topk_groups] contiguous."""
    op = "topk_sum_and_topk_group_idx"
    _checks.tensor(op, "scores", scores, (torch.float32,), (None, None, None))
    t, g, p = scores.shape
    for arg, value, top in (("num_topk_sum", num_topk_sum, p), ("num_topk_groups", num_topk_groups, g)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            _checks.fail(op, arg, repr(value), f"an int in [1, {top}]", "pass the validated call's value")
    if not fits(triton.next_power_of_2(g) * triton.next_power_of_2(p)):
        _checks.fail(op, "scores", f"{g} groups x {p}", f"at most {MAX_ROW} per row", "use the layout-reference provider")
    out = torch.empty(t, num_topk_groups, dtype=torch.int64, device=scores.device)
    if t:
        group_select_kernel[(triton.cdiv(t, BLOCK_T),)](
            scores, out, t, g, p, scores.stride(0), scores.stride(1), scores.stride(2), N=num_topk_sum,
            KG=num_topk_groups, G_POW2=triton.next_power_of_2(g), P_POW2=triton.next_power_of_2(p),
            KG_POW2=triton.next_power_of_2(num_topk_groups), BLOCK_T=BLOCK_T, UNIT=scores.stride(2) == 1)
    return out
