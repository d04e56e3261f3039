"""`top2_sum_gate`'s routing arguments (TileKernels': shared experts as routed slots, fixed routing,
the logical-to-physical map, EP/TP ranks): their checks, and the shared-slot step."""

from __future__ import annotations

import torch

from ...core.checks import check_bool, check_int, check_tensor, first_bad
from ...core.contract import checks_values
from ...core.errors import ContractError, format_problem


def check_routing_args(op: str, t: int, e: int, num_topk: int, use_shared_as_routed: object,
                       num_shared_experts: object, ep_rank: object, num_ep_ranks: object, tp_rank: object,
                       num_tp_ranks: object, fix_routing_mask: object, to_physical_map: object, logical_count: object,
                       unmapped_topk_idx: object, mask: torch.Tensor | None, device: torch.device) -> int:
    """Validate the routing arguments; return the extra physical experts (map columns - 1, else 0)."""
    check_bool(op, "use_shared_as_routed", use_shared_as_routed)
    check_int(op, "num_shared_experts", num_shared_experts, 0)
    check_int(op, "num_ep_ranks", num_ep_ranks, 1)
    check_int(op, "ep_rank", ep_rank, 0, num_ep_ranks - 1)
    check_int(op, "num_tp_ranks", num_tp_ranks, 1)
    check_int(op, "tp_rank", tp_rank, 0, num_tp_ranks - 1)
    shared = num_shared_experts if use_shared_as_routed else 0
    if use_shared_as_routed and shared < 1:
        raise ContractError(format_problem(op, "num_shared_experts", num_shared_experts,
                                           ">= 1 with use_shared_as_routed", "pass the shared expert count"))
    if (to_physical_map is None) != (logical_count is None):
        missing = "logical_count" if logical_count is None else "to_physical_map"
        raise ContractError(format_problem(op, missing, "None", "given together with the other map argument",
                                           "pass both to_physical_map and logical_count, or neither"))
    extra = 0
    if to_physical_map is not None:
        rows = e + shared
        check_tensor(op, "to_physical_map", to_physical_map, (torch.int32,), (rows, None), device,
                     f"pass int32 [num_routed + num_shared experts = {rows}, 1 + extra replicas]")
        check_tensor(op, "logical_count", logical_count, (torch.int32,), (rows,), device,
                     f"pass int32 [{rows}] replica counts")
        extra = to_physical_map.shape[1] - 1
    if shared > extra:
        raise ContractError(format_problem(op, "use_shared_as_routed", f"True with {shared} shared experts and "
                                           f"{extra} extra physical experts", "num_shared_experts <= "
                                           "to_physical_map.shape[1] - 1 (TileKernels' rule)",
                                           "pass a to_physical_map with room for the shared experts' replicas"))
    if num_tp_ranks > 1:
        n = e + extra
        if n % num_ep_ranks:
            raise ContractError(format_problem(op, "num_ep_ranks", num_ep_ranks, f"a divisor of the {n} physical "
                                               "experts (num_routed + extra)", "pass the EP group size"))
        if to_physical_map is not None and checks_values(to_physical_map) and to_physical_map.numel():
            bad = to_physical_map >= n
            if bool(bad.any()):
                raise ContractError(format_problem(op, "to_physical_map", f"naming ids >= {n} ({first_bad(bad)})",
                                                   f"physical ids < {n} (num_routed + extra)",
                                                   "number the physical experts from 0"))
    _check_fixed_routing(op, t, e, num_topk, fix_routing_mask, unmapped_topk_idx, mask, device)
    return extra


def _check_fixed_routing(op: str, t: int, e: int, num_topk: int, fix_routing_mask: object, unmapped_topk_idx: object,
                         mask: torch.Tensor | None, device: torch.device) -> None:
    if unmapped_topk_idx is not None:
        check_tensor(op, "unmapped_topk_idx", unmapped_topk_idx, (torch.int64,), (t, num_topk), device,
                     f"pass int64 [{t}, {num_topk}] (it receives the logical experts)")
        if t and num_topk > 1 and unmapped_topk_idx.stride(1) != 1:
            raise ContractError(format_problem(op, "unmapped_topk_idx", f"with strides {unmapped_topk_idx.stride()}",
                                               "a contiguous last dim", "pass a row-major tensor"))
    if fix_routing_mask is None:
        return
    check_tensor(op, "fix_routing_mask", fix_routing_mask, (torch.bool,), (t,), device, f"pass bool [{t}] or None")
    if unmapped_topk_idx is None:
        raise ContractError(format_problem(op, "unmapped_topk_idx", "None with fix_routing_mask",
                                           "the fixed experts of the masked tokens",
                                           "pass unmapped_topk_idx holding the experts to keep"))
    if checks_values(fix_routing_mask, unmapped_topk_idx) and t:
        rows = fix_routing_mask if mask is None else fix_routing_mask & mask
        fixed = unmapped_topk_idx[rows]
        bad = (fixed < 0) | (fixed >= e)
        if bool(bad.any()):
            raise ContractError(format_problem(op, "unmapped_topk_idx", f"out of range on fixed tokens "
                                               f"({first_bad(bad)})", f"expert ids in [0, {e}) where "
                                               "fix_routing_mask is True", "store valid logical experts first"))


def append_shared_slots(idx: torch.Tensor, weights: torch.Tensor, e: int, shared: int,
                        mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx, weights) with `shared` more slots naming experts e .. e+shared-1 at weight 1 (-1 and 0
    for masked tokens), as TileKernels routes shared experts."""
    t = idx.shape[0]
    ids = torch.arange(e, e + shared, dtype=idx.dtype, device=idx.device).expand(t, shared)
    ones = torch.ones(t, shared, dtype=weights.dtype, device=weights.device)
    if mask is not None:
        ids = ids.masked_fill(~mask[:, None], -1)
        ones = ones.masked_fill(~mask[:, None], 0.0)
    return torch.cat((idx, ids), dim=1), torch.cat((weights, ones), dim=1)
