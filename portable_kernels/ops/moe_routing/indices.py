"""Rewrites of expert ids (TileKernels `mask_indices_by_tp`, `inplace_unique_group_indices`, and the
logical-to-physical expert map of `top2_sum_gate`): references, contracts and public ops.
Negative ids mean "no expert" and stay -1 everywhere.

- `mask_indices_by_tp(indices, n, num_ep_ranks, tp_rank, num_tp_ranks)`: n experts over
  num_ep_ranks ranks (per_rank = n / num_ep_ranks consecutive ids each); EP ranks form DP groups
  of num_tp_ranks consecutive ranks. An id on EP rank r is kept only when r % num_tp_ranks ==
  tp_rank, and renumbered to the experts this TP rank sees: id - tp_rank·per_rank, then minus
  (per_rank·num_tp_ranks - per_rank) per whole DP group below it; every other id becomes -1.
- `inplace_unique_group_indices(group_indices, num_groups)`: per row, every repeat of a value after
  its first (leftmost) occurrence becomes -1, in place.
- `map_to_physical_experts(topk_idx, to_physical_map, logical_count, ep_rank)`: logical expert l of
  row t becomes to_physical_map[l, (ep_rank + t·23333) % logical_count[l]] — TileKernels' rule for
  spreading tokens over an expert's logical_count replicas.
"""

from __future__ import annotations

import attrs
import torch

from ...core.checks import check_int, check_tensor, first_bad
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.providers import Inputs
from .mapping import INDEX_DTYPES

#: the multiplier TileKernels hashes token rows with to pick an expert replica
REPLICA_HASH_MULTIPLIER = 23333


def mask_indices_by_tp_reference(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                                 num_tp_ranks: int) -> torch.Tensor:
    """Ids of this TP rank's experts renumbered locally, -1 elsewhere (indices' dtype)."""
    per_rank = n // num_ep_ranks
    per_dp = per_rank * num_tp_ranks
    ids = indices.to(torch.int64)
    keep = (ids >= 0) & (torch.div(ids.clamp(min=0), per_rank, rounding_mode="floor") % num_tp_ranks == tp_rank)
    local = ids - tp_rank * per_rank
    local = local - torch.div(local, per_dp, rounding_mode="floor") * (per_dp - per_rank)
    return torch.where(keep & (local >= 0), local, -1).to(indices.dtype)


def unique_group_indices_reference(group_indices: torch.Tensor) -> torch.Tensor:
    """A copy with every repeat after a value's first occurrence in its row set to -1."""
    values, order = torch.sort(group_indices, dim=1, stable=True)
    repeat = torch.zeros_like(values, dtype=torch.bool)
    repeat[:, 1:] = values[:, 1:] == values[:, :-1]
    in_place = torch.zeros_like(repeat).scatter_(1, order, repeat)
    return group_indices.masked_fill(in_place, -1)


def map_to_physical_experts_reference(topk_idx: torch.Tensor, to_physical_map: torch.Tensor,
                                      logical_count: torch.Tensor, ep_rank: int) -> torch.Tensor:
    """int64 [T, k]: each logical id replaced by its replica for this row; -1 stays -1."""
    ids = topk_idx.to(torch.int64)
    valid = ids >= 0
    logical = ids.clamp(min=0)
    row = torch.arange(ids.shape[0], device=ids.device, dtype=torch.int64)[:, None]
    count = logical_count.to(torch.int64)[logical]
    replica = (ep_rank + row * REPLICA_HASH_MULTIPLIER) % count.clamp(min=1)
    physical = to_physical_map.to(torch.int64)[logical, replica]
    return torch.where(valid, physical, -1)


@attrs.frozen
class MaskByTpInputs(Inputs):
    """One mask_indices_by_tp call (validated)."""

    indices: torch.Tensor
    n: int
    num_ep_ranks: int
    tp_rank: int
    num_tp_ranks: int
    device_field = "indices"


@attrs.frozen
class UniqueGroupsInputs(Inputs):
    """One inplace_unique_group_indices call: group_indices [T, k] is rewritten in place."""

    group_indices: torch.Tensor
    num_groups: int
    device_field = "group_indices"


@attrs.frozen
class PhysicalMapInputs(Inputs):
    """One map_to_physical_experts call: logical ids [T, k], map int32 [L, D], counts int32 [L]."""

    topk_idx: torch.Tensor
    to_physical_map: torch.Tensor
    logical_count: torch.Tensor
    ep_rank: int
    device_field = "topk_idx"


def mask_indices_by_tp_kernel(call: MaskByTpInputs) -> torch.Tensor:
    """Reference kernel of mask_indices_by_tp."""
    return mask_indices_by_tp_reference(call.indices, call.n, call.num_ep_ranks, call.tp_rank, call.num_tp_ranks)


def unique_group_indices_kernel(call: UniqueGroupsInputs) -> None:
    """Reference kernel of inplace_unique_group_indices: rewrites group_indices."""
    call.group_indices.copy_(unique_group_indices_reference(call.group_indices))


def map_to_physical_experts_kernel(call: PhysicalMapInputs) -> torch.Tensor:
    """Reference kernel of map_to_physical_experts."""
    return map_to_physical_experts_reference(call.topk_idx, call.to_physical_map, call.logical_count, call.ep_rank)


MASK_INDICES_BY_TP = register_contract(OpContract("mask_indices_by_tp", mask_indices_by_tp_reference,
                                                  Tolerance(dequantized=0.0), kernel=mask_indices_by_tp_kernel))
INPLACE_UNIQUE_GROUP_INDICES = register_contract(OpContract(
    "inplace_unique_group_indices", unique_group_indices_reference, Tolerance(dequantized=0.0),
    kernel=unique_group_indices_kernel))
MAP_TO_PHYSICAL_EXPERTS = register_contract(OpContract(
    "map_to_physical_experts", map_to_physical_experts_reference, Tolerance(dequantized=0.0),
    kernel=map_to_physical_experts_kernel))


def _check_below(op: str, arg: str, t: torch.Tensor, limit: int, what: str) -> None:
    if checks_values(t) and t.numel():
        bad = t >= limit
        if bool(bad.any()):
            raise ContractError(format_problem(op, arg, f"with values >= {limit} ({first_bad(bad)})",
                                               f"values < {limit} ({what}; negative = none)",
                                               f"pass ids below {limit}, or mask others with -1"))


@public_op(MASK_INDICES_BY_TP)
def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                       num_tp_ranks: int) -> torch.Tensor:
    """Keep the expert ids of one TP rank, renumbered locally (TileKernels `mask_indices_by_tp`).

    indices: int64/int32 [T, k], values < n, negative = none; n: experts over all EP ranks, a
    multiple of num_ep_ranks; 0 <= tp_rank < num_tp_ranks. Returns a new tensor like indices; see
    the module docstring for the renumbering.
    """
    if is_compiling():
        return compiled_call("mask_indices_by_tp", indices, n, num_ep_ranks, tp_rank, num_tp_ranks)
    op = MASK_INDICES_BY_TP.name
    check_tensor(op, "indices", indices, INDEX_DTYPES, (None, None), None, "pass int64 expert ids [T, k]")
    check_int(op, "num_ep_ranks", num_ep_ranks, 1)
    check_int(op, "n", n, num_ep_ranks, fix=f"pass the expert count of all {num_ep_ranks} EP ranks")
    if n % num_ep_ranks:
        raise ContractError(format_problem(op, "n", n, f"a multiple of num_ep_ranks = {num_ep_ranks}",
                                           "pass experts_per_rank * num_ep_ranks"))
    check_int(op, "num_tp_ranks", num_tp_ranks, 1)
    check_int(op, "tp_rank", tp_rank, 0, num_tp_ranks - 1)
    _check_below(op, "indices", indices, n, "the expert count n")
    return run(MASK_INDICES_BY_TP, MaskByTpInputs(indices, n, num_ep_ranks, tp_rank, num_tp_ranks))


@public_op(INPLACE_UNIQUE_GROUP_INDICES)
def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> None:
    """Replace each repeat of a group id after its first occurrence in a row with -1, in place
    (TileKernels `inplace_unique_group_indices`).

    group_indices: int64/int32 [T, k], contiguous, values < num_groups (negative = none).
    """
    if is_compiling():
        return compiled_call("inplace_unique_group_indices", group_indices, num_groups)
    op = INPLACE_UNIQUE_GROUP_INDICES.name
    check_tensor(op, "group_indices", group_indices, INDEX_DTYPES, (None, None), None,
                 "pass int64 group ids [T, k]")
    check_int(op, "num_groups", num_groups, 1)
    if not group_indices.is_contiguous():
        raise ContractError(format_problem(op, "group_indices", f"non-contiguous (strides {group_indices.stride()})",
                                           "a contiguous tensor (it is rewritten in place)", "pass .contiguous()"))
    _check_below(op, "group_indices", group_indices, num_groups, "num_groups")
    run(INPLACE_UNIQUE_GROUP_INDICES, UniqueGroupsInputs(group_indices, num_groups))


@public_op(MAP_TO_PHYSICAL_EXPERTS)
def map_to_physical_experts(topk_idx: torch.Tensor, to_physical_map: torch.Tensor, logical_count: torch.Tensor,
                            ep_rank: int = 0) -> torch.Tensor:
    """Logical expert ids to physical replicas (the `to_physical_map` / `logical_count` step of
    TileKernels' `top2_sum_gate`); see the module docstring.

    topk_idx: int64/int32 [T, k], values < L, negative = none; to_physical_map: int32 [L, D] physical
    ids >= 0 (replica j of logical l at [l, j]); logical_count: int32 [L], 1 <= count <= D replicas in
    use; ep_rank >= 0 shifts the replica choice. Returns int64 [T, k].
    """
    if is_compiling():
        return compiled_call("map_to_physical_experts", topk_idx, to_physical_map, logical_count, ep_rank)
    op = MAP_TO_PHYSICAL_EXPERTS.name
    check_tensor(op, "topk_idx", topk_idx, INDEX_DTYPES, (None, None), None, "pass logical expert ids [T, k]")
    device = topk_idx.device
    check_tensor(op, "to_physical_map", to_physical_map, (torch.int32,), (None, None), device,
                 "pass int32 [num_logical_experts, num_replicas]")
    lc, replicas = to_physical_map.shape
    check_tensor(op, "logical_count", logical_count, (torch.int32,), (lc,), device,
                 f"pass int32 [{lc}] replica counts")
    check_int(op, "ep_rank", ep_rank, 0)
    _check_below(op, "topk_idx", topk_idx, lc, "the logical expert count")
    if checks_values(logical_count, to_physical_map):
        bad = (logical_count < 1) | (logical_count > replicas)
        if lc and bool(bad.any()):
            raise ContractError(format_problem(op, "logical_count", f"out of range ({first_bad(bad)})",
                                               f"1 <= count <= {replicas} (the map's columns)",
                                               "count the replicas each logical expert uses"))
        if to_physical_map.numel() and bool((to_physical_map < 0).any()):
            raise ContractError(format_problem(op, "to_physical_map", "with negative ids",
                                               "physical expert ids >= 0", "fill every replica slot"))
    return run(MAP_TO_PHYSICAL_EXPERTS, PhysicalMapInputs(topk_idx, to_physical_map, logical_count, ep_rank))
