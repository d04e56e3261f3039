"""Stable top-k selections of the gate, as ops of their own (TileKernels `topk_gate` and
`topk_sum_and_topk_group_idx`): references, contracts and public ops.

Both rank best first and give equal values to the smaller index (a stable sort), so their output is
exact, not a set: `topk_gate(scores, k)` -> the k best experts per token;
`topk_sum_and_topk_group_idx(scores [T, G, P], n, kg)` -> the kg groups whose n best scores sum
highest (the n best taken in descending order and added left to right in fp32). `top2_sum_gate`
ranks its groups and experts with these same references.
"""

from __future__ import annotations

import attrs
import torch

from ...core.checks import check_finite, check_int, check_tensor
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ...core.providers import Inputs

_FINITE_FIX = "find where the scores became NaN/Inf upstream; they cannot be ranked"


def stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """int64 indices of the k largest along the last dim, best first, equal values to the smaller index."""
    # a contiguous [..., k] result (TileKernels' strides), not a view of the full sort
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k].contiguous()


def topk_sum(scores: torch.Tensor, num_topk_sum: int) -> torch.Tensor:
    """fp32 [..., G]: the sum of the num_topk_sum largest scores of each group [..., G, P] (best first,
    added left to right)."""
    best = scores.float().topk(num_topk_sum, dim=-1, sorted=True).values
    total = best[..., 0]
    for j in range(1, num_topk_sum):  # an explicit order, so every provider can add the same way
        total = total + best[..., j]
    return total


def topk_gate_reference(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """int64 [T, k]: the k best experts per token, best first, ties to the smaller index."""
    return stable_topk(scores.float(), num_topk)


def topk_sum_and_topk_group_idx_reference(scores: torch.Tensor, num_topk_sum: int,
                                          num_topk_groups: int) -> torch.Tensor:
    """int64 [T, kg]: the groups with the highest top-num_topk_sum sums, best first, ties to the smaller index."""
    return stable_topk(topk_sum(scores, num_topk_sum), num_topk_groups)


@attrs.frozen
class TopkGateInputs(Inputs):
    """One topk_gate call: scores fp32 [T, E], k."""

    scores: torch.Tensor
    num_topk: int
    device_field = "scores"

    def dims(self) -> dict[str, int]:
        t, e = self.scores.shape
        return {"T": t, "E": e, "k": self.num_topk}


@attrs.frozen
class GroupSelectInputs(Inputs):
    """One topk_sum_and_topk_group_idx call: scores fp32 [T, G, P], the scores summed per group, the groups kept."""

    scores: torch.Tensor
    num_topk_sum: int
    num_topk_groups: int
    device_field = "scores"

    def dims(self) -> dict[str, int]:
        t, g, p = self.scores.shape
        return {"T": t, "G": g, "P": p, "n": self.num_topk_sum, "kg": self.num_topk_groups}


def topk_gate_kernel(call: TopkGateInputs) -> torch.Tensor:
    """Reference kernel of topk_gate."""
    return topk_gate_reference(call.scores, call.num_topk)


def topk_sum_and_topk_group_idx_kernel(call: GroupSelectInputs) -> torch.Tensor:
    """Reference kernel of topk_sum_and_topk_group_idx."""
    return topk_sum_and_topk_group_idx_reference(call.scores, call.num_topk_sum, call.num_topk_groups)


TOPK_GATE = register_contract(OpContract("topk_gate", topk_gate_reference, Tolerance(dequantized=0.0),
                                         kernel=topk_gate_kernel))
TOPK_SUM_AND_TOPK_GROUP_IDX = register_contract(OpContract(
    "topk_sum_and_topk_group_idx", topk_sum_and_topk_group_idx_reference, Tolerance(dequantized=0.0),
    kernel=topk_sum_and_topk_group_idx_kernel))


@public_op(TOPK_GATE)
def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """The num_topk best experts per token (TileKernels `topk_gate`).

    scores: fp32 [T, E], finite; 1 <= num_topk <= E. Returns a contiguous int64 [T, num_topk], best
    first, equal scores to the smaller index.
    """
    if is_compiling():
        return compiled_call("topk_gate", scores, num_topk)
    op = TOPK_GATE.name
    check_tensor(op, "scores", scores, (torch.float32,), (None, None), None, "pass fp32 [num_tokens, num_experts]")
    check_int(op, "num_topk", num_topk, 1, scores.shape[1], f"choose at most the {scores.shape[1]} experts")
    check_finite(op, "scores", scores, _FINITE_FIX)
    return run(TOPK_GATE, TopkGateInputs(scores, num_topk))


@public_op(TOPK_SUM_AND_TOPK_GROUP_IDX)
def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """The num_topk_groups groups whose num_topk_sum best scores sum highest (TileKernels
    `topk_sum_and_topk_group_idx`).

    scores: fp32 [T, G, P] (P experts per group), finite; 1 <= num_topk_sum <= P (TileKernels takes
    1 or 2); 1 <= num_topk_groups <= G. Returns a contiguous int64 [T, num_topk_groups], best first,
    ties to the smaller group index.
    """
    if is_compiling():
        return compiled_call("topk_sum_and_topk_group_idx", scores, num_topk_sum, num_topk_groups)
    op = TOPK_SUM_AND_TOPK_GROUP_IDX.name
    check_tensor(op, "scores", scores, (torch.float32,), (None, None, None), None,
                 "pass fp32 [num_tokens, num_groups, num_experts_per_group]")
    _, g, p = scores.shape
    check_int(op, "num_topk_sum", num_topk_sum, 1, max(p, 1), f"sum at most the {p} experts of a group")
    check_int(op, "num_topk_groups", num_topk_groups, 1, max(g, 1), f"keep at most the {g} groups")
    check_finite(op, "scores", scores, _FINITE_FIX)
    return run(TOPK_SUM_AND_TOPK_GROUP_IDX, GroupSelectInputs(scores, num_topk_sum, num_topk_groups))
