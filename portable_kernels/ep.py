"""Expert-parallel dispatch / combine (DeepEP names): the contract, as a single-process reference.

DeepEP moves MoE tokens between R ranks that each own E/R consecutive experts. This module states
what every rank must receive and return, by simulating all R ranks in one process: each
`simulate_*` function takes one entry per rank (rank r's own inputs, as it would pass them to
DeepEP's `Buffer`) and returns one result per rank (what DeepEP returns on rank r), so a real
distributed implementation can be checked rank by rank against it.

- `get_dispatch_layout(topk_idx, num_experts, num_ranks)`: DeepEP's `Buffer.get_dispatch_layout`
  as a module-level op (the group size is an argument instead of the buffer's, no event).
- normal mode, `simulate_dispatch` / `simulate_combine`: each token reaches each destination rank
  at most once; rows ordered by source rank, then source token; topk_idx remapped to local expert
  ids (-1 elsewhere, weight 0 there); per-expert counts aligned up to `expert_alignment`; combine
  sums the returned rows of each source token WITHOUT weights, in fp32.
- low-latency mode, `simulate_low_latency_dispatch` / `simulate_low_latency_combine`: per-expert
  packed rows [num_local_experts, num_max_dispatch_tokens_per_rank * R, hidden], one copy per
  (token, expert); combine returns the WEIGHTED sum. Row order inside an expert is unspecified
  (`LowLatencyDispatchResult.sorted_by_source` gives the canonical order to compare in).

Rule: negative topk_idx entries mean "no expert"; the non-negative experts of one token are
distinct (a duplicate is refused: DeepEP would move the token twice, torch_npu refuses it).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence, Union

import attrs
import torch

from .contract import OpContract, Tolerance, bind, checks_values, public_op, register_contract
from .errors import ContractError, format_problem
from .layouts.constants import FP8_BLOCK_K
from .layouts.moe import aligned_counts
from .quantization import quantize_blocks_reference
from .tensors import FP8_DTYPE, QuantTensor, describe

#: the marker of "no expert" in remapped topk_idx and of an unused slot in recv_src_info
NO_EXPERT = -1
TOPK_IDX_DTYPES = (torch.int64, torch.int32)
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
WEIGHT_DTYPE = torch.float32
#: FP8 tokens travel with one fp32 scale per this many hidden channels (DeepEP: hidden // 128)
SCALE_BLOCK = FP8_BLOCK_K
#: DeepEP packs each low-latency layout range as (begin << 32) | count in one int64
LAYOUT_RANGE_SHIFT = 32
LAYOUT_RANGE_COUNT_MASK = (1 << LAYOUT_RANGE_SHIFT) - 1
#: calc_diff bound of a combine: fp32 sums in another order, rounded to a 16-bit output
COMBINE_BOUND = 1e-5
#: calc_diff bound of FP8 low-latency rows against the bf16 tokens (the per-token FP8 cast's)
FP8_DISPATCH_BOUND = 1e-3

Rows = Union[torch.Tensor, "tuple[torch.Tensor, torch.Tensor]"]


# --------------------------------------------------------------------------------------------
# Result types
# --------------------------------------------------------------------------------------------

@attrs.frozen(eq=False)
class DispatchHandle:
    """What `simulate_combine` (and a cached `simulate_dispatch`) needs from a normal dispatch, on one rank.

    rank:               this rank's index
    rank_prefix_matrix: int32 [R, R]; entry [i][j] = tokens ranks 0..i send to rank j (as DeepEP's
                        handle[0]): rank j's rows from source i are rows [m[i-1][j], m[i][j])
    recv_src_idx:       int32 [num_recv_tokens]; the source token index of each received row
    is_token_in_rank:   bool [num_tokens, R]; where this rank's own tokens went
    """

    rank: int
    rank_prefix_matrix: torch.Tensor
    recv_src_idx: torch.Tensor
    is_token_in_rank: torch.Tensor

    @property
    def num_ranks(self) -> int:
        return int(self.rank_prefix_matrix.shape[0])

    @property
    def num_tokens(self) -> int:
        """Tokens this rank dispatched (the rows its combine returns)."""
        return int(self.is_token_in_rank.shape[0])

    @property
    def recv_src_rank(self) -> torch.Tensor:
        """int32 [num_recv_tokens]: the source rank of each received row."""
        ends = self.rank_prefix_matrix[:, self.rank].long()
        counts = ends - torch.cat((ends.new_zeros(1), ends[:-1]))
        ranks = torch.arange(self.num_ranks, device=ends.device)
        return torch.repeat_interleave(ranks, counts).to(torch.int32)


@attrs.frozen(eq=False)
class DispatchResult:
    """What normal-mode `dispatch` returns on one rank (DeepEP's tuple without the event).

    recv_x:            [N, H] in x's dtype, or (fp8 [N, H], fp32 [N, H/128]) when x was FP8
    recv_topk_idx:     [N, k] in topk_idx's dtype: local expert ids, -1 where the expert lives elsewhere
    recv_topk_weights: fp32 [N, k], 0 where recv_topk_idx is -1 (None without weights)
    num_recv_tokens_per_expert_list: rows per local expert aligned up to expert_alignment, as a
                       tuple of ints (DeepEP returns a list); None in a cached dispatch
    handle:            the DispatchHandle for combine

    Unpacks like DeepEP's return: `recv_x, recv_topk_idx, recv_topk_weights, counts, handle = result`.
    """

    recv_x: Rows
    recv_topk_idx: torch.Tensor | None
    recv_topk_weights: torch.Tensor | None
    num_recv_tokens_per_expert_list: tuple[int, ...] | None
    handle: DispatchHandle

    def __iter__(self) -> Iterator[Any]:
        yield from (self.recv_x, self.recv_topk_idx, self.recv_topk_weights,
                    self.num_recv_tokens_per_expert_list, self.handle)


@attrs.frozen(eq=False)
class CombineResult:
    """What normal-mode `combine` returns on one rank: combined_x [T, H] in x's dtype (the sum of
    the returned rows of each own token; 0 for a token sent nowhere) and combined_topk_weights
    fp32 [T, k] (the sum of the returned weight rows) or None."""

    combined_x: torch.Tensor
    combined_topk_weights: torch.Tensor | None

    def __iter__(self) -> Iterator[Any]:
        yield from (self.combined_x, self.combined_topk_weights)


@attrs.frozen(eq=False)
class LowLatencyHandle:
    """DeepEP's low-latency handle, field for field (it unpacks in DeepEP's order).

    recv_src_info:   int32 [L, M*R]; the source token index of each valid slot (-1 in unused slots
                     here; DeepEP leaves them unspecified)
    recv_layout_range: int64 [L, R]; (begin << 32) | count of the slots holding source rank s's tokens
    num_max_dispatch_tokens_per_rank (M), hidden (H), num_experts (E = R*L)
    """

    recv_src_info: torch.Tensor
    recv_layout_range: torch.Tensor
    num_max_dispatch_tokens_per_rank: int
    hidden: int
    num_experts: int

    def __iter__(self) -> Iterator[Any]:
        yield from (self.recv_src_info, self.recv_layout_range, self.num_max_dispatch_tokens_per_rank,
                    self.hidden, self.num_experts)

    @property
    def num_ranks(self) -> int:
        return int(self.recv_layout_range.shape[1])

    @property
    def range_begin(self) -> torch.Tensor:
        """int64 [L, R]: first slot of each source rank's tokens."""
        return self.recv_layout_range >> LAYOUT_RANGE_SHIFT

    @property
    def range_count(self) -> torch.Tensor:
        """int64 [L, R]: how many tokens of each source rank the expert received."""
        return self.recv_layout_range & LAYOUT_RANGE_COUNT_MASK

    @property
    def recv_src_rank(self) -> torch.Tensor:
        """int32 [L, M*R]: the source rank of each slot, -1 in slots outside every range."""
        slots = torch.arange(self.recv_src_info.shape[1], device=self.recv_layout_range.device)
        begin, count = self.range_begin[..., None], self.range_count[..., None]
        member = (slots >= begin) & (slots < begin + count)  # [L, R, M*R]
        rank = member.to(torch.int32).argmax(dim=1).to(torch.int32)
        return torch.where(member.any(dim=1), rank, NO_EXPERT)


@attrs.frozen(eq=False)
class LowLatencyDispatchResult:
    """What `low_latency_dispatch` returns on one rank (DeepEP's tuple without event and hook).

    recv_x:     [L, M*R, H] in x's dtype, or (fp8 [L, M*R, H], fp32 [L, M*R, H/128]) with use_fp8;
                only the first recv_count[e] slots of expert e are valid (zeros elsewhere here)
    recv_count: int32 [L]; valid slots per local expert
    handle:     the LowLatencyHandle for combine

    Unpacks like DeepEP's return: `recv_x, recv_count, handle = result`.
    """

    recv_x: Rows
    recv_count: torch.Tensor
    handle: LowLatencyHandle

    def __iter__(self) -> Iterator[Any]:
        yield from (self.recv_x, self.recv_count, self.handle)

    def sorted_by_source(self) -> "LowLatencyDispatchResult":
        """The same receive in the canonical order: each expert's valid slots sorted by (source rank,
        source token), ranges rebuilt to match, unused slots zero (and -1 in recv_src_info). Two
        correct implementations give identical sorted results, whatever order they wrote."""
        h = self.handle
        src_rank = h.recv_src_rank.long()
        valid = src_rank >= 0
        num_slots = h.recv_src_info.shape[1]
        key = torch.where(valid, src_rank * num_slots + h.recv_src_info.long(), h.num_ranks * num_slots)
        order = key.argsort(dim=1, stable=True)
        keep = torch.take_along_dim(valid, order, dim=1)
        info = torch.where(keep, torch.take_along_dim(h.recv_src_info, order, dim=1), NO_EXPERT)
        count = h.range_count
        begin = count.cumsum(dim=1) - count
        handle = LowLatencyHandle(info.to(torch.int32), (begin << LAYOUT_RANGE_SHIFT) | count,
                                  h.num_max_dispatch_tokens_per_rank, h.hidden, h.num_experts)

        def reorder(t: torch.Tensor) -> torch.Tensor:
            moved = torch.take_along_dim(t, order[..., None], dim=1)
            return torch.where(keep[..., None], moved, torch.zeros((), dtype=t.dtype, device=t.device))

        if isinstance(self.recv_x, tuple):
            data, scales = self.recv_x
            recv_x: Rows = (reorder(data.view(torch.uint8)).view(data.dtype), reorder(scales))
        else:
            recv_x = reorder(self.recv_x)
        return LowLatencyDispatchResult(recv_x, self.recv_count, handle)


# --------------------------------------------------------------------------------------------
# Reference math (plain torch; vectorized over tokens, ranks concatenated)
# --------------------------------------------------------------------------------------------

def _rank_offsets(sizes: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(first global row of each rank [R], rank of each global row [sum(sizes)]) for concatenated ranks."""
    counts = torch.tensor(list(sizes), dtype=torch.int64, device=device)
    starts = counts.cumsum(0) - counts
    return starts, torch.repeat_interleave(torch.arange(len(sizes), device=device), counts)


def dispatch_layout_reference(topk_idx: torch.Tensor, num_experts: int, num_ranks: int
                              ) -> tuple[torch.Tensor, None, torch.Tensor, torch.Tensor]:
    """topk_idx [T, k] -> (num_tokens_per_rank int32 [R], None, num_tokens_per_expert int32 [E],
    is_token_in_rank bool [T, R])."""
    idx = topk_idx.long()
    valid = idx >= 0
    # a spare column R collects the "no expert" entries so one scatter covers every entry
    dest = torch.where(valid, idx // (num_experts // num_ranks), num_ranks)
    in_rank = torch.zeros(idx.shape[0], num_ranks + 1, dtype=torch.bool, device=idx.device)
    in_rank.scatter_(1, dest, True)
    is_token_in_rank = in_rank[:, :num_ranks].contiguous()
    num_tokens_per_rank = is_token_in_rank.sum(dim=0, dtype=torch.int32)
    num_tokens_per_expert = torch.bincount(idx[valid], minlength=num_experts).to(torch.int32)
    return num_tokens_per_rank, None, num_tokens_per_expert, is_token_in_rank


def dispatch_reference(xs: tuple[torch.Tensor, ...], x_scales: tuple[torch.Tensor, ...] | None,
                       topk_idx: tuple[torch.Tensor, ...] | None, topk_weights: tuple[torch.Tensor, ...] | None,
                       is_token_in_rank: tuple[torch.Tensor, ...], num_experts: int | None,
                       expert_alignment: int) -> tuple[tuple[Any, ...], ...]:
    """Normal-mode dispatch of R ranks at once. Per destination rank: (recv_x, recv_x_scales | None,
    recv_topk_idx | None, recv_topk_weights | None, aligned counts int32 [L] | None,
    recv_src_idx int32 [N], rank_prefix_matrix int32 [R, R])."""
    num_ranks = len(xs)
    device = xs[0].device
    starts, rank_of = _rank_offsets([x.shape[0] for x in xs], device)
    in_rank = torch.cat(is_token_in_rank)  # [G, R], global rows ordered by (source rank, token)
    # nonzero of the transpose walks destinations first, then global rows: the contract's order
    dest, row = in_rank.T.nonzero(as_tuple=True)
    recv_per_rank = torch.bincount(dest, minlength=num_ranks).tolist()
    sent = torch.zeros(num_ranks, num_ranks, dtype=torch.int64, device=device)
    sent.index_add_(0, rank_of, in_rank.long())
    rank_prefix_matrix = sent.cumsum(0).to(torch.int32)
    src_idx = (row - starts[rank_of[row]]).to(torch.int32)

    def spread(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return t.split(recv_per_rank)

    recv_x = spread(torch.cat(xs)[row])
    recv_scales = spread(torch.cat(x_scales)[row]) if x_scales is not None else (None,) * num_ranks
    recv_idx = recv_w = counts = (None,) * num_ranks
    if topk_idx is not None and num_experts is not None:
        per_rank = num_experts // num_ranks
        idx = torch.cat(topk_idx)
        local = idx[row].long() - (dest * per_rank)[:, None]
        is_local = (local >= 0) & (local < per_rank)
        recv_idx = spread(torch.where(is_local, local, NO_EXPERT).to(idx.dtype))
        if topk_weights is not None:
            weights = torch.cat(topk_weights)[row]
            recv_w = spread(torch.where(is_local, weights, torch.zeros((), dtype=weights.dtype, device=device)))
        flat = idx.long()
        per_expert = torch.bincount(flat[flat >= 0], minlength=num_experts)
        counts = aligned_counts(per_expert, expert_alignment).to(torch.int32).view(num_ranks, per_rank).unbind(0)
    src = spread(src_idx)
    return tuple((recv_x[d], recv_scales[d], recv_idx[d], recv_w[d], counts[d], src[d], rank_prefix_matrix)
                 for d in range(num_ranks))


def combine_reference(xs: tuple[torch.Tensor, ...], topk_weights: tuple[torch.Tensor, ...] | None,
                      recv_src_rank: tuple[torch.Tensor, ...], recv_src_idx: tuple[torch.Tensor, ...],
                      num_tokens: tuple[int, ...]) -> tuple[tuple[torch.Tensor, torch.Tensor | None], ...]:
    """Normal-mode combine of R ranks: every received row goes back to its source token and is
    added there (no weights) in fp32. Per source rank: (combined_x [T, H] in x's dtype,
    combined_topk_weights fp32 [T, k] | None)."""
    device = xs[0].device
    starts, _ = _rank_offsets(num_tokens, device)
    dest_row = starts[torch.cat(recv_src_rank).long()] + torch.cat(recv_src_idx).long()
    total = sum(num_tokens)
    out = torch.zeros(total, xs[0].shape[1], dtype=torch.float32, device=device)
    out.index_add_(0, dest_row, torch.cat(xs).float())
    combined = out.to(xs[0].dtype).split(list(num_tokens))
    weights: tuple[torch.Tensor | None, ...] = (None,) * len(num_tokens)
    if topk_weights is not None:
        w = torch.zeros(total, topk_weights[0].shape[1], dtype=torch.float32, device=device)
        weights = w.index_add_(0, dest_row, torch.cat(topk_weights).float()).split(list(num_tokens))
    return tuple(zip(combined, weights))


def low_latency_dispatch_reference(xs: tuple[torch.Tensor, ...], topk_idx: tuple[torch.Tensor, ...],
                                   num_max_dispatch_tokens_per_rank: int, num_experts: int, use_fp8: bool,
                                   round_scale: bool) -> tuple[tuple[Any, ...], ...]:
    """Low-latency dispatch of R ranks: one copy of a token per selected expert, packed per expert
    (slots ordered by source rank, then token). FP8 rows are each source token's per-token cast
    (1 x 128 blocks; power-of-two scales when round_scale). Per destination rank:
    (recv_x, recv_x_scales | None, recv_count int32 [L], recv_src_info int32 [L, M*R],
    recv_layout_range int64 [L, R])."""
    num_ranks = len(xs)
    per_rank = num_experts // num_ranks
    num_slots = num_max_dispatch_tokens_per_rank * num_ranks
    device = xs[0].device
    x = torch.cat(xs)
    starts, rank_of = _rank_offsets([t.shape[0] for t in xs], device)
    idx = torch.cat(topk_idx).long()
    row, slot = (idx >= 0).nonzero(as_tuple=True)  # ordered by global row = (source rank, token)
    expert = idx[row, slot]
    expert, order = torch.sort(expert, stable=True)
    row = row[order]
    per_expert = torch.bincount(expert, minlength=num_experts)
    pos = torch.arange(expert.numel(), device=device) - (per_expert.cumsum(0) - per_expert)[expert]

    def pack(values: torch.Tensor) -> torch.Tensor:
        bits = values.view(torch.uint8) if values.dtype == FP8_DTYPE else values
        out = torch.zeros(num_experts, num_slots, values.shape[1], dtype=bits.dtype, device=device)
        out[expert, pos] = bits[row]
        return out.view(values.dtype).view(num_ranks, per_rank, num_slots, values.shape[1])

    if use_fp8:
        data, scales = quantize_blocks_reference(x, 1, SCALE_BLOCK, round_scale)
        recv_x, recv_scales = pack(data).unbind(0), pack(scales).unbind(0)
    else:
        recv_x, recv_scales = pack(x).unbind(0), (None,) * num_ranks
    info = torch.full((num_experts, num_slots), NO_EXPERT, dtype=torch.int32, device=device)
    info[expert, pos] = (row - starts[rank_of[row]]).to(torch.int32)
    from_rank = torch.bincount(expert * num_ranks + rank_of[row], minlength=num_experts * num_ranks)
    count = from_rank.view(num_experts, num_ranks)
    layout_range = ((count.cumsum(1) - count) << LAYOUT_RANGE_SHIFT) | count
    recv_count = per_expert.to(torch.int32).view(num_ranks, per_rank)
    info = info.view(num_ranks, per_rank, num_slots)
    layout_range = layout_range.view(num_ranks, per_rank, num_ranks)
    return tuple((recv_x[d], recv_scales[d], recv_count[d], info[d], layout_range[d]) for d in range(num_ranks))


def low_latency_combine_reference(xs: tuple[torch.Tensor, ...], topk_idx: tuple[torch.Tensor, ...],
                                  topk_weights: tuple[torch.Tensor, ...], recv_src_info: tuple[torch.Tensor, ...],
                                  recv_layout_range: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Low-latency combine of R ranks: each valid slot goes back to its source token, times that
    token's weight for the slot's expert, summed in fp32. Per source rank: combined_x [T, H] in x's
    dtype (0 for a token with no expert). Unused slots are never read."""
    num_ranks = len(xs)
    per_rank, num_slots, hidden = xs[0].shape
    num_experts = per_rank * num_ranks
    device = xs[0].device
    x = torch.stack(xs).view(num_experts, num_slots, hidden)
    handle = LowLatencyHandle(torch.stack(recv_src_info).view(num_experts, num_slots),
                              torch.stack(recv_layout_range).view(num_experts, num_ranks), num_slots // num_ranks,
                              hidden, num_experts)
    src_rank = handle.recv_src_rank
    expert, pos = (src_rank >= 0).nonzero(as_tuple=True)
    sizes = [t.shape[0] for t in topk_idx]
    starts, _ = _rank_offsets(sizes, device)
    dest_row = starts[src_rank[expert, pos].long()] + handle.recv_src_info[expert, pos].long()
    idx, weights = torch.cat(topk_idx).long(), torch.cat(topk_weights).float()
    match = idx[dest_row] == expert[:, None]
    weight = torch.where(match, weights[dest_row], torch.zeros((), device=device)).sum(dim=1)
    out = torch.zeros(sum(sizes), hidden, dtype=torch.float32, device=device)
    out.index_add_(0, dest_row, x[expert, pos].float() * weight[:, None])
    return out.to(xs[0].dtype).split(sizes)


GET_DISPATCH_LAYOUT = register_contract(OpContract(
    "get_dispatch_layout", dispatch_layout_reference, Tolerance(dequantized=0.0), kernel=dispatch_layout_reference))
SIMULATE_DISPATCH = register_contract(OpContract(
    "simulate_dispatch", dispatch_reference, Tolerance(dequantized=0.0)))
SIMULATE_COMBINE = register_contract(OpContract(
    "simulate_combine", combine_reference, Tolerance(dequantized=COMBINE_BOUND)))
SIMULATE_LOW_LATENCY_DISPATCH = register_contract(OpContract(
    "simulate_low_latency_dispatch", low_latency_dispatch_reference,
    Tolerance(dequantized=0.0, unquantized=FP8_DISPATCH_BOUND)))
SIMULATE_LOW_LATENCY_COMBINE = register_contract(OpContract(
    "simulate_low_latency_combine", low_latency_combine_reference, Tolerance(dequantized=COMBINE_BOUND)))


# --------------------------------------------------------------------------------------------
# Validation (every check runs before anything is computed)
# --------------------------------------------------------------------------------------------

def _check_positive_int(op: str, arg: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ContractError(format_problem(op, arg, repr(value), "a positive int", f"pass {arg} as a Python int >= 1"))
    return value


def _check_bool(op: str, arg: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ContractError(format_problem(op, arg, repr(value), "a bool", "pass True or False"))


def _check_num_experts(op: str, num_experts: Any, num_ranks: int) -> int:
    _check_positive_int(op, "num_experts", num_experts)
    if num_experts % num_ranks:
        raise ContractError(format_problem(op, "num_experts", num_experts, f"a multiple of the {num_ranks} ranks",
                                           "give every rank the same number of experts (num_experts = R * L)"))
    return num_experts


def _check_per_rank(op: str, arg: str, value: Any, num_ranks: int | None = None) -> int:
    """A list or tuple with one entry per rank; returns R."""
    if not isinstance(value, (list, tuple)) or len(value) == 0:
        raise ContractError(format_problem(op, arg, describe(value), "a non-empty list with one entry per rank",
                                           f"pass [{arg.rstrip('s')} of rank 0, {arg.rstrip('s')} of rank 1, ...]"))
    if num_ranks is not None and len(value) != num_ranks:
        raise ContractError(format_problem(op, arg, f"a list of {len(value)} entries", f"{num_ranks} (one per rank)",
                                           "pass one entry per rank, in rank order"))
    return len(value)


def _check_device(op: str, arg: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ContractError(format_problem(op, arg, f"on {t.device}", f"on {device} like xs[0]",
                                           "simulate every rank on one device (move the tensors there)"))


def _check_tensor(op: str, arg: str, t: Any, dtypes: tuple[torch.dtype, ...], shape: tuple[int | None, ...],
                  device: torch.device | None, fix: str) -> torch.Tensor:
    """t is a tensor of one of `dtypes` whose shape matches `shape` (None matches any size)."""
    want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes:
        raise ContractError(format_problem(op, arg, describe(t), f"a tensor of dtype {dtypes} shaped {want}", fix))
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        raise ContractError(format_problem(op, arg, f"of shape {tuple(t.shape)}", f"shape {want}", fix))
    if device is not None:
        _check_device(op, arg, t, device)
    return t


def _check_topk_idx(op: str, arg: str, idx: Any, num_experts: int, num_tokens: int | None, num_topk: int | None,
                    device: torch.device | None) -> torch.Tensor:
    _check_tensor(op, arg, idx, TOPK_IDX_DTYPES, (num_tokens, num_topk), device,
                  "pass the router's expert ids, int64 [num_tokens, num_topk] (negative = no expert)")
    if idx.shape[1] == 0:
        raise ContractError(format_problem(op, arg, "of shape (T, 0)", "at least one top-k column",
                                           "pass num_topk >= 1 (mark unused entries with -1)"))
    if idx.numel() == 0 or not checks_values(idx):
        return idx  # on an accelerator reading the ids would synchronize; see contract.checks_values
    top = int(idx.max())
    if top >= num_experts:
        raise ContractError(format_problem(op, arg, f"holding expert id {top}", f"ids < num_experts = {num_experts} "
                                           "(or negative for no expert)", "route only to existing experts"))
    ordered = idx.sort(dim=1).values
    duplicate = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    if bool(duplicate.any()):
        row = int(duplicate.any(dim=1).nonzero()[0])
        raise ContractError(format_problem(op, arg, f"choosing an expert twice in row {row} ({idx[row].tolist()})",
                                           "distinct expert ids per token (negative entries excepted)",
                                           "set repeated entries to -1"))
    return idx


def _check_weights(op: str, arg: str, w: Any, idx: torch.Tensor, device: torch.device) -> torch.Tensor:
    return _check_tensor(op, arg, w, (WEIGHT_DTYPE,), tuple(idx.shape), device,
                         "pass fp32 weights shaped like topk_idx")


def _check_fp8_pair(op: str, arg: str, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(x, QuantTensor):
        if x.element != "e4m3" or x.granularity != (1, SCALE_BLOCK):
            raise ContractError(format_problem(op, arg, repr(x), f"FP8 e4m3 tokens scaled per (1, {SCALE_BLOCK})",
                                               "quantize with per_token_cast_to_fp8(x)"))
        x = (x.data, x.scale)
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise ContractError(format_problem(op, arg, describe(x), "an FP8 pair (fp8 [T, H], fp32 [T, H/128]) like xs[0]",
                                           "send every rank's tokens in one form: all plain or all FP8 pairs"))
    data = _check_tensor(op, arg, x[0], (FP8_DTYPE,), (None, None), None, "pass x_fp8 as float8_e4m3fn [T, H]")
    if data.shape[1] % SCALE_BLOCK:
        raise ContractError(format_problem(op, arg, f"FP8 tokens with hidden {data.shape[1]}",
                                           f"hidden divisible by {SCALE_BLOCK}", "pad hidden to a multiple of 128"))
    scales = _check_tensor(op, arg, x[1], (torch.float32,), (data.shape[0], data.shape[1] // SCALE_BLOCK), None,
                           "pass the fp32 per-token scales [T, H/128] of the same cast")
    return data, scales


def _check_x(op: str, xs: Any, allow_fp8: bool) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    """Per-rank tokens: all plain [T_r, H] tensors or (allow_fp8) all FP8 (data, scales [T_r, H/128]) pairs,
    of one dtype and hidden size, on one device."""
    _check_per_rank(op, "xs", xs)
    fp8 = allow_fp8 and isinstance(xs[0], (tuple, list, QuantTensor))
    data, scales = [], []
    for r, x in enumerate(xs):
        if fp8:
            d, s = _check_fp8_pair(op, f"xs[{r}]", x)
            data.append(d)
            scales.append(s)
        else:
            data.append(_check_tensor(op, f"xs[{r}]", x, X_DTYPES, (None, None), None,
                                      "pass every rank's tokens as bf16 [num_tokens, hidden]"))
    first = data[0]
    for r, t in enumerate(data):
        arg = f"xs[{r}]"
        _check_device(op, arg, t, first.device)
        if scales:
            _check_device(op, arg, scales[r], first.device)
        if t.dtype != first.dtype or t.shape[1] != first.shape[1] or t.shape[1] == 0:
            raise ContractError(format_problem(op, arg, describe(t), f"{first.dtype} [*, {first.shape[1]}] like xs[0], "
                                               "hidden >= 1", "give every rank tokens of one dtype and hidden size"))
    return tuple(data), (tuple(scales) if fp8 else None)


def _check_topk_per_rank(op: str, topk_idx: Any, topk_weights: Any, sizes: Sequence[int | None],
                         device: torch.device, num_experts: int
                         ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    """Per-rank topk_idx [T_r, k] (one k for all ranks) and optional fp32 weights of the same shape."""
    num_ranks = len(sizes)
    _check_per_rank(op, "topk_idx", topk_idx, num_ranks)
    num_topk = topk_idx[0].shape[1] if isinstance(topk_idx[0], torch.Tensor) and topk_idx[0].dim() == 2 else None
    idx = tuple(_check_topk_idx(op, f"topk_idx[{r}]", topk_idx[r], num_experts, sizes[r], num_topk, device)
                for r in range(num_ranks))
    if topk_weights is None:
        return idx, None
    _check_per_rank(op, "topk_weights", topk_weights, num_ranks)
    weights = tuple(_check_weights(op, f"topk_weights[{r}]", topk_weights[r], idx[r], device) for r in range(num_ranks))
    return idx, weights


def _check_dispatch_handles(op: str, handles: Any, num_ranks: int, device: torch.device) -> tuple[DispatchHandle, ...]:
    _check_per_rank(op, "handles", handles, num_ranks)
    for r, h in enumerate(handles):
        arg = f"handles[{r}]"
        if not isinstance(h, DispatchHandle) or h.rank != r or h.num_ranks != num_ranks:
            raise ContractError(format_problem(op, arg, describe(h), f"the DispatchHandle of rank {r} of {num_ranks}",
                                               "pass the handles of one simulate_dispatch call, in rank order"))
        _check_device(op, arg, h.recv_src_idx, device)
        if not torch.equal(h.rank_prefix_matrix, handles[0].rank_prefix_matrix):
            raise ContractError(format_problem(op, arg, "from another dispatch than handles[0]",
                                               "handles of one dispatch",
                                               "pass the handles of one simulate_dispatch call"))
    return tuple(handles)


# --------------------------------------------------------------------------------------------
# Public ops
# --------------------------------------------------------------------------------------------

@public_op(GET_DISPATCH_LAYOUT)
def get_dispatch_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int
                        ) -> tuple[torch.Tensor, None, torch.Tensor, torch.Tensor]:
    """Where one rank's tokens go: DeepEP's `Buffer.get_dispatch_layout(topk_idx, num_experts)`.

    topk_idx: int64 (or int32) [T, k], expert ids < num_experts, negative = no expert
    num_experts: E, a multiple of num_ranks (rank r owns experts [r*E/R, (r+1)*E/R))
    num_ranks: R, the EP group size (DeepEP takes it from its Buffer's group)
    Returns (num_tokens_per_rank int32 [R], num_tokens_per_rdma_rank None, num_tokens_per_expert
    int32 [E], is_token_in_rank bool [T, R]) — DeepEP's tuple without the trailing event; the RDMA
    split is None as in DeepEP's intranode setting (a deployment detail, not part of the contract).
    """
    op = GET_DISPATCH_LAYOUT.name
    _check_positive_int(op, "num_ranks", num_ranks)
    _check_num_experts(op, num_experts, num_ranks)
    _check_topk_idx(op, "topk_idx", topk_idx, num_experts, None, None, None)
    call = bind(GET_DISPATCH_LAYOUT, {}, [topk_idx])
    return call.run(topk_idx=topk_idx, num_experts=num_experts, num_ranks=num_ranks)


@public_op(SIMULATE_DISPATCH)
def simulate_dispatch(xs: Sequence[Any], topk_idx: Sequence[torch.Tensor] | None = None,
                      topk_weights: Sequence[torch.Tensor] | None = None, num_experts: int | None = None,
                      expert_alignment: int = 1, *, handles: Sequence[DispatchHandle] | None = None
                      ) -> list[DispatchResult]:
    """What normal-mode `Buffer.dispatch` returns on each of R ranks, given every rank's inputs.

    xs: per rank, bf16/fp16/fp32 [T_r, H], or an FP8 pair (fp8 [T_r, H], fp32 [T_r, H/128]) (or a
        QuantTensor with granularity (1, 128)); H divisible by 128 for FP8
    topk_idx: per rank, int64/int32 [T_r, k] (negative = no expert); topk_weights: per rank fp32
        [T_r, k] or None
    num_experts: E, a multiple of R; expert_alignment: counts are aligned up to it
    handles: instead of topk_idx, the handles of an earlier dispatch, to move new tokens along the
        same layout (DeepEP's cached dispatch); then only recv_x is computed, and the handles are
        returned as they were
    Returns one DispatchResult per rank (see its fields; rank d's rows come from source ranks in
    order, and inside a source in token order).
    """
    op = SIMULATE_DISPATCH.name
    data, scales = _check_x(op, xs, allow_fp8=True)
    num_ranks, device = len(data), data[0].device
    _check_positive_int(op, "expert_alignment", expert_alignment)
    if handles is not None:
        for arg, value in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
            if value is not None:
                raise ContractError(format_problem(op, arg, "given together with handles", "None in a cached dispatch",
                                                   "pass either handles (reuse a layout) or topk_idx (a new one)"))
        given = _check_dispatch_handles(op, handles, num_ranks, device)
        for r, h in enumerate(given):
            if h.num_tokens != data[r].shape[0]:
                raise ContractError(format_problem(op, f"xs[{r}]", f"holding {data[r].shape[0]} tokens",
                                                   f"{h.num_tokens} tokens like the dispatch of handles[{r}]",
                                                   "a cached dispatch moves new rows of the same tokens along "
                                                   "the same layout"))
        idx, weights, experts, in_rank = None, None, None, tuple(h.is_token_in_rank for h in given)
    else:
        if topk_idx is None:
            raise ContractError(format_problem(op, "topk_idx", "None", "per-rank expert ids (or handles=...)",
                                               "pass the router's topk_idx of every rank"))
        experts = _check_num_experts(op, num_experts, num_ranks)
        idx, weights = _check_topk_per_rank(op, topk_idx, topk_weights, [x.shape[0] for x in data], device, experts)
        in_rank = tuple(get_dispatch_layout(t, experts, num_ranks)[3] for t in idx)
    tensors = [*data, *(scales or ()), *(idx or ()), *(weights or ()), *in_rank]
    call = bind(SIMULATE_DISPATCH, {}, tensors)
    out = call.run(xs=data, x_scales=scales, topk_idx=idx, topk_weights=weights, is_token_in_rank=in_rank,
                   num_experts=experts, expert_alignment=expert_alignment)
    results = []
    for rank, (recv_x, recv_scales, recv_idx, recv_w, counts, src_idx, prefix) in enumerate(out):
        if handles is not None:
            handle = handles[rank]
        else:
            handle = DispatchHandle(rank, prefix, src_idx, in_rank[rank])
        rows: Rows = recv_x if recv_scales is None else (recv_x, recv_scales)
        listed = None if counts is None else tuple(int(c) for c in counts.tolist())
        results.append(DispatchResult(rows, recv_idx, recv_w, listed, handle))
    return results


@public_op(SIMULATE_COMBINE)
def simulate_combine(xs: Sequence[torch.Tensor], handles: Sequence[DispatchHandle],
                     topk_weights: Sequence[torch.Tensor] | None = None) -> list[CombineResult]:
    """What normal-mode `Buffer.combine(x, handle, topk_weights)` returns on each of R ranks.

    xs: per rank d, bf16/fp16/fp32 [N_d, H]: one row per row rank d received (same order)
    handles: per rank, the DispatchHandle of that rank's dispatch
    topk_weights: per rank fp32 [N_d, k] or None
    Returns per rank CombineResult(combined_x [T, H] in xs' dtype = the fp32 sum of the rows
    returned for each own token, no weights; combined_topk_weights fp32 [T, k] = the sum of the
    returned weight rows, or None).
    """
    op = SIMULATE_COMBINE.name
    num_ranks = _check_per_rank(op, "xs", xs)
    first = _check_tensor(op, "xs[0]", xs[0], X_DTYPES, (None, None), None, "pass bf16 rows [num_recv_tokens, hidden]")
    device, hidden = first.device, first.shape[1]
    given = _check_dispatch_handles(op, handles, num_ranks, device)
    for r, x in enumerate(xs):
        _check_tensor(op, f"xs[{r}]", x, (first.dtype,), (given[r].recv_src_idx.shape[0], hidden), device,
                      f"return one {first.dtype} row of hidden {hidden} per row rank {r} received")
    weights = None
    if topk_weights is not None:
        _check_per_rank(op, "topk_weights", topk_weights, num_ranks)
        first_w = topk_weights[0]
        num_topk = first_w.shape[1] if isinstance(first_w, torch.Tensor) and first_w.dim() == 2 else None
        weights = tuple(_check_tensor(op, f"topk_weights[{r}]", w, (WEIGHT_DTYPE,), (xs[r].shape[0], num_topk), device,
                                      "pass fp32 weights [num_recv_tokens, k] (the received recv_topk_weights)")
                        for r, w in enumerate(topk_weights))
    src_rank = tuple(h.recv_src_rank for h in given)
    src_idx = tuple(h.recv_src_idx for h in given)
    num_tokens = tuple(h.num_tokens for h in given)
    call = bind(SIMULATE_COMBINE, {}, [*xs, *(weights or ()), *src_idx])
    out = call.run(xs=tuple(xs), topk_weights=weights, recv_src_rank=src_rank, recv_src_idx=src_idx,
                   num_tokens=num_tokens)
    return [CombineResult(x, w) for x, w in out]


@public_op(SIMULATE_LOW_LATENCY_DISPATCH)
def simulate_low_latency_dispatch(xs: Sequence[torch.Tensor], topk_idx: Sequence[torch.Tensor],
                                  num_max_dispatch_tokens_per_rank: int, num_experts: int, use_fp8: bool = True,
                                  round_scale: bool = False) -> list[LowLatencyDispatchResult]:
    """What `Buffer.low_latency_dispatch(x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
    use_fp8)` returns on each of R ranks.

    xs: per rank, bf16/fp16/fp32 [T_r, H] with T_r <= num_max_dispatch_tokens_per_rank (M);
        H divisible by 128 when use_fp8
    topk_idx: per rank, int64/int32 [T_r, k] (negative = no expert)
    num_experts: E = R * L; use_fp8: cast each token per (1, 128) block on the sending side;
    round_scale: power-of-two (UE8M0-representable) scales in that cast
    Returns per rank LowLatencyDispatchResult(recv_x [L, M*R, H] or (fp8, fp32 [L, M*R, H/128]),
    recv_count int32 [L], handle). Only the first recv_count[e] slots of expert e are valid; their
    order is unspecified (this reference writes source rank, then token). The scales are the
    logical fp32 numbers; DeepEP stores them column-major (TMA), a layout matter, not the contract's.
    """
    op = SIMULATE_LOW_LATENCY_DISPATCH.name
    data, _ = _check_x(op, xs, allow_fp8=False)
    num_ranks = len(data)
    max_tokens = _check_positive_int(op, "num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank)
    experts = _check_num_experts(op, num_experts, num_ranks)
    _check_bool(op, "use_fp8", use_fp8)
    _check_bool(op, "round_scale", round_scale)
    for r, x in enumerate(data):
        if x.shape[0] > max_tokens:
            raise ContractError(format_problem(op, f"xs[{r}]", f"holding {x.shape[0]} tokens",
                                               f"at most num_max_dispatch_tokens_per_rank = {max_tokens}",
                                               "raise num_max_dispatch_tokens_per_rank or send fewer tokens"))
    if use_fp8 and data[0].shape[1] % SCALE_BLOCK:
        raise ContractError(format_problem(op, "xs[0]", f"of hidden {data[0].shape[1]}",
                                           f"hidden divisible by {SCALE_BLOCK} with use_fp8",
                                           "pad hidden to a multiple of 128 or pass use_fp8=False"))
    idx, _ = _check_topk_per_rank(op, topk_idx, None, [x.shape[0] for x in data], data[0].device, experts)
    call = bind(SIMULATE_LOW_LATENCY_DISPATCH, {}, [*data, *idx])
    out = call.run(xs=data, topk_idx=idx, num_max_dispatch_tokens_per_rank=max_tokens, num_experts=experts,
                   use_fp8=use_fp8, round_scale=round_scale)
    hidden = data[0].shape[1]
    results = []
    for recv_x, recv_scales, recv_count, info, layout_range in out:
        rows: Rows = recv_x if recv_scales is None else (recv_x, recv_scales)
        handle = LowLatencyHandle(info, layout_range, max_tokens, hidden, experts)
        results.append(LowLatencyDispatchResult(rows, recv_count, handle))
    return results


@public_op(SIMULATE_LOW_LATENCY_COMBINE)
def simulate_low_latency_combine(xs: Sequence[torch.Tensor], topk_idx: Sequence[torch.Tensor],
                                 topk_weights: Sequence[torch.Tensor], handles: Sequence[LowLatencyHandle]
                                 ) -> list[torch.Tensor]:
    """What `Buffer.low_latency_combine(x, topk_idx, topk_weights, handle)` returns on each of R ranks.

    xs: per rank, bf16/fp16/fp32 [L, M*R, H]: the expert outputs in the slots the dispatch filled
        (unused slots are never read)
    topk_idx, topk_weights: per rank, the tokens' own [T_r, k] ids (as dispatched) and fp32 weights
    handles: per rank, the LowLatencyHandle of that rank's dispatch
    Returns per rank combined_x [T_r, H] in xs' dtype: for each token, the sum over its experts e
    of weight_e * (expert e's row for it), accumulated in fp32 (0 for a token with no expert).
    """
    op = SIMULATE_LOW_LATENCY_COMBINE.name
    num_ranks = _check_per_rank(op, "handles", handles)
    for r, h in enumerate(handles):
        if not isinstance(h, LowLatencyHandle):
            raise ContractError(format_problem(op, f"handles[{r}]", describe(h), "a LowLatencyHandle",
                                               "pass the handles simulate_low_latency_dispatch returned "
                                               "(a DeepEP handle tuple t converts as LowLatencyHandle(*t))"))
    h0 = handles[0]
    experts = h0.num_experts
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 1 or experts % num_ranks:
        raise ContractError(format_problem(op, "handles[0]", f"for num_experts = {experts!r}",
                                           f"a positive multiple of the {num_ranks} ranks",
                                           "pass one handle per rank of one simulate_low_latency_dispatch call"))
    per_rank, max_tokens, hidden = experts // num_ranks, h0.num_max_dispatch_tokens_per_rank, h0.hidden
    num_slots = max_tokens * num_ranks
    _check_per_rank(op, "xs", xs, num_ranks)
    first = _check_tensor(op, "xs[0]", xs[0], X_DTYPES, (per_rank, num_slots, hidden), None,
                          "pass the expert outputs [num_local_experts, M*R, hidden] = "
                          f"[{per_rank}, {num_slots}, {hidden}]")
    device = first.device
    for r, (x, h) in enumerate(zip(xs, handles)):
        if (h.num_experts, h.num_max_dispatch_tokens_per_rank, h.hidden) != (experts, max_tokens, hidden):
            raise ContractError(format_problem(op, f"handles[{r}]", "from another dispatch than handles[0]",
                                               "handles of one dispatch", "pass the handles of one dispatch call"))
        _check_tensor(op, f"handles[{r}]", h.recv_src_info, (torch.int32,), (per_rank, num_slots), device,
                      "pass the handle simulate_low_latency_dispatch returned")
        _check_tensor(op, f"handles[{r}]", h.recv_layout_range, (torch.int64,), (per_rank, num_ranks), device,
                      "pass the handle simulate_low_latency_dispatch returned")
        _check_tensor(op, f"xs[{r}]", x, (first.dtype,), (per_rank, num_slots, hidden), device,
                      f"pass {first.dtype} expert outputs shaped like xs[0]")
    _check_per_rank(op, "topk_idx", topk_idx, num_ranks)
    sizes = [t.shape[0] if isinstance(t, torch.Tensor) else None for t in topk_idx]
    for r, size in enumerate(sizes):
        if size is not None and size > max_tokens:
            raise ContractError(format_problem(op, f"topk_idx[{r}]", f"of {size} tokens",
                                               f"at most num_max_dispatch_tokens_per_rank = {max_tokens}",
                                               "pass the topk_idx given to the dispatch"))
    idx, weights = _check_topk_per_rank(op, topk_idx, topk_weights, sizes, device, experts)
    if weights is None:
        raise ContractError(format_problem(op, "topk_weights", "None", "per-rank fp32 weights [T_r, k]",
                                           "the low-latency combine is weighted: pass the router's weights"))
    routed = torch.cat(idx).long()
    routed = torch.bincount(routed[routed >= 0], minlength=experts)
    received = torch.stack([h.range_count.sum(dim=1) for h in handles]).view(experts)
    if not torch.equal(routed, received):
        expert = int((routed != received).nonzero()[0])
        raise ContractError(format_problem(op, "topk_idx", f"routing {int(routed[expert])} tokens to expert {expert}",
                                           f"the {int(received[expert])} the handles received",
                                           "pass the topk_idx given to simulate_low_latency_dispatch"))
    call = bind(SIMULATE_LOW_LATENCY_COMBINE, {}, [*xs, *idx, *weights])
    return list(call.run(xs=tuple(xs), topk_idx=idx, topk_weights=weights,
                         recv_src_info=tuple(h.recv_src_info for h in handles),
                         recv_layout_range=tuple(h.recv_layout_range for h in handles)))


__all__ = [
    "CombineResult", "DispatchHandle", "DispatchResult", "LowLatencyDispatchResult", "LowLatencyHandle",
    "get_dispatch_layout", "simulate_combine", "simulate_dispatch", "simulate_low_latency_combine",
    "simulate_low_latency_dispatch",
]
