"""Expert-id rewrites in Triton (TileKernels' `mask_indices_by_tp`, `inplace_unique_group_indices`
and `top2_sum_gate`'s logical-to-physical map): exact integer results, the contracts' references'.

Each is one elementwise (or one row-local) pass; negative ids stay -1. No id is used as an address
without a bound: an id outside the map (unchecked device values) gives -1, so every read stays
inside its tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portable_kernels.ops.moe_routing.indices import REPLICA_HASH_MULTIPLIER

from . import _checks
from ._common import serialized

INDEX_DTYPES = (torch.int32, torch.int64)
#: ids per program of the elementwise passes, rows per program of the row pass
BLOCK = 1024
BLOCK_ROWS = 32


@triton.jit
def mask_by_tp_kernel(ids_ptr, out_ptr, N, PER_RANK, PER_DP, TP_RANK, NUM_TP, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = n < N
    ids = tl.load(ids_ptr + n, mask=inside, other=-1).to(tl.int64)
    keep = (ids >= 0) & ((tl.maximum(ids, 0) // PER_RANK) % NUM_TP == TP_RANK)
    local = ids - TP_RANK * PER_RANK
    local = local - (local // PER_DP) * (PER_DP - PER_RANK)  # local >= 0 wherever keep: // is the floor
    out = tl.where(keep & (local >= 0), local, -1)
    tl.store(out_ptr + n, out.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def physical_map_kernel(ids_ptr, map_ptr, count_ptr, out_ptr, N, K, L, D, EP_RANK, stride_ml, stride_md,
                        HASH: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = n < N
    ids = tl.load(ids_ptr + n, mask=inside, other=-1).to(tl.int64)
    known = inside & (ids >= 0) & (ids < L)
    logical = tl.where(known, ids, 0)
    count = tl.maximum(tl.load(count_ptr + logical, mask=known, other=1).to(tl.int64), 1)
    replica = (EP_RANK + (n // K) * HASH) % count  # both sides >= 0: the remainder is Python's
    at = known & (replica < D)
    physical = tl.load(map_ptr + logical * stride_ml + replica * stride_md, mask=at, other=-1).to(tl.int64)
    tl.store(out_ptr + n, tl.where(at, physical, -1), mask=inside)


@triton.jit
def unique_groups_kernel(ids_ptr, T, K, BLOCK_ROWS: tl.constexpr, K_POW2: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    slots = tl.arange(0, K_POW2)
    m = (rows[:, None] < T) & (slots[None, :] < K)
    at = ids_ptr + rows[:, None].to(tl.int64) * K + slots[None, :]
    v = tl.load(at, mask=m, other=0)
    # a slot repeats when an earlier slot of its row holds the same value
    same = (v[:, :, None] == v[:, None, :]) & (slots[None, None, :] < slots[None, :, None])
    repeat = tl.max(same.to(tl.int32), axis=2) > 0
    tl.store(at, tl.full(v.shape, -1, v.dtype), mask=m & repeat)


@serialized
def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                       num_tp_ranks: int) -> torch.Tensor:
    """indices int32/int64 [T, k] -> a new contiguous tensor of its dtype: this TP rank's ids renumbered, -1 elsewhere."""
    op = "mask_indices_by_tp"
    _checks.tensor(op, "indices", indices, INDEX_DTYPES, (None, None))
    for arg, value, low in (("n", n, 1), ("num_ep_ranks", num_ep_ranks, 1), ("num_tp_ranks", num_tp_ranks, 1),
                            ("tp_rank", tp_rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            _checks.fail(op, arg, repr(value), f"an int >= {low}", "pass the validated call's value")
    if n % num_ep_ranks or tp_rank >= num_tp_ranks:
        _checks.fail(op, "n", f"{n} over {num_ep_ranks} EP ranks, tp_rank {tp_rank} of {num_tp_ranks}",
                     "n a multiple of num_ep_ranks and tp_rank < num_tp_ranks", "pass the validated call's values")
    ids = indices.contiguous()
    out = torch.empty_like(ids)
    if ids.numel():
        per_rank = n // num_ep_ranks
        mask_by_tp_kernel[(triton.cdiv(ids.numel(), BLOCK),)](ids, out, ids.numel(), per_rank, per_rank * num_tp_ranks,
                                                              tp_rank, num_tp_ranks, BLOCK=BLOCK)
    return out


@serialized
def map_to_physical_experts(topk_idx: torch.Tensor, to_physical_map: torch.Tensor, logical_count: torch.Tensor,
                            ep_rank: int) -> torch.Tensor:
    """topk_idx int32/int64 [T, k] -> int64 [T, k]: logical l of row t -> to_physical_map[l, (ep_rank + t·23333)
    % logical_count[l]]; -1 stays -1 (and so does an id outside the map, or a replica past its columns)."""
    op = "map_to_physical_experts"
    _checks.tensor(op, "topk_idx", topk_idx, INDEX_DTYPES, (None, None))
    _checks.tensor(op, "to_physical_map", to_physical_map, INDEX_DTYPES, (None, None), topk_idx.device)
    lc, d = to_physical_map.shape
    _checks.tensor(op, "logical_count", logical_count, INDEX_DTYPES, (lc,), topk_idx.device)
    if isinstance(ep_rank, bool) or not isinstance(ep_rank, int) or ep_rank < 0:
        _checks.fail(op, "ep_rank", repr(ep_rank), "an int >= 0", "pass this rank's index")
    ids = topk_idx.contiguous()
    out = torch.empty(ids.shape, dtype=torch.int64, device=ids.device)
    if ids.numel():
        counts = logical_count.contiguous()
        physical_map_kernel[(triton.cdiv(ids.numel(), BLOCK),)](
            ids, to_physical_map, counts, out, ids.numel(), ids.shape[1], lc, d, ep_rank,
            to_physical_map.stride(0), to_physical_map.stride(1), HASH=REPLICA_HASH_MULTIPLIER, BLOCK=BLOCK)
    return out


@serialized
def inplace_unique_group_indices(group_indices: torch.Tensor) -> None:
    """group_indices int32/int64 [T, k], contiguous: each repeat after a value's first occurrence in its row -> -1."""
    op = "inplace_unique_group_indices"
    _checks.tensor(op, "group_indices", group_indices, INDEX_DTYPES, (None, None))
    _checks.contiguous(op, "group_indices", group_indices)
    t, k = group_indices.shape
    if t and k > 1:
        unique_groups_kernel[(triton.cdiv(t, BLOCK_ROWS),)](group_indices, t, k, BLOCK_ROWS=BLOCK_ROWS,
                                                            K_POW2=triton.next_power_of_2(k))
