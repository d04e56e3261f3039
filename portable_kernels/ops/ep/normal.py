"""Normal-mode dispatch / combine: the references (R ranks at once), their contracts and the
`simulate_dispatch` / `simulate_combine` ops."""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import torch

from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...layouts.moe import aligned_counts
from ...core.providers import Inputs
from .checks import (_check_dispatch_handles, _check_num_experts, _check_per_rank, _check_positive_int, _check_tensor,
                     _check_topk_per_rank, _check_x)
from .constants import COMBINE_BOUND, NO_EXPERT, WEIGHT_DTYPE, X_DTYPES
from .dispatch_layout import get_dispatch_layout
from .handle_checks import check_combine_handles
from .ranks import _rank_offsets
from .results import CombineResult, DispatchHandle, DispatchResult, Rows

# --------------------------------------------------------------------------------------------
# Reference math (plain torch; vectorized over tokens, ranks concatenated)
# --------------------------------------------------------------------------------------------

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


@attrs.frozen
class SimulateDispatchInputs(Inputs):
    """One simulate_dispatch call: every rank's inputs, as dispatch_reference takes them."""

    xs: tuple[torch.Tensor, ...]
    x_scales: tuple[torch.Tensor, ...] | None
    topk_idx: tuple[torch.Tensor, ...] | None
    topk_weights: tuple[torch.Tensor, ...] | None
    is_token_in_rank: tuple[torch.Tensor, ...]
    num_experts: int | None
    expert_alignment: int
    device_field = "xs"


@attrs.frozen
class SimulateCombineInputs(Inputs):
    """One simulate_combine call: every rank's returned rows and where they came from."""

    xs: tuple[torch.Tensor, ...]
    topk_weights: tuple[torch.Tensor, ...] | None
    recv_src_rank: tuple[torch.Tensor, ...]
    recv_src_idx: tuple[torch.Tensor, ...]
    num_tokens: tuple[int, ...]
    device_field = "xs"


SIMULATE_DISPATCH = register_contract(OpContract(
    "simulate_dispatch", dispatch_reference, Tolerance(dequantized=0.0)))
SIMULATE_COMBINE = register_contract(OpContract(
    "simulate_combine", combine_reference, Tolerance(dequantized=COMBINE_BOUND)))


# --------------------------------------------------------------------------------------------
# Public ops
# --------------------------------------------------------------------------------------------

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
    out = run(SIMULATE_DISPATCH, SimulateDispatchInputs(tuple(data), scales, idx, weights, tuple(in_rank), experts,
                                                       expert_alignment))
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
    check_combine_handles(op, given)
    src_rank = tuple(h.recv_src_rank for h in given)
    src_idx = tuple(h.recv_src_idx for h in given)
    num_tokens = tuple(h.num_tokens for h in given)
    out = run(SIMULATE_COMBINE, SimulateCombineInputs(tuple(xs), weights, src_rank, src_idx, num_tokens))
    return [CombineResult(x, w) for x, w in out]
