"""Low-latency dispatch / combine: the references (R ranks at once), their contracts and the
`simulate_low_latency_dispatch` / `simulate_low_latency_combine` ops."""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import torch

from ...core.checks import check_allocation
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.providers import Inputs
from ..quant.fp8 import quantize_blocks_reference
from ...core.tensors import FP8_DTYPE, describe
from .checks import (_check_bool, _check_num_experts, _check_per_rank, _check_positive_int, _check_tensor,
                     _check_topk_per_rank, _check_x, check_finite_for_round_scale)
from .constants import COMBINE_BOUND, FP8_DISPATCH_BOUND, LAYOUT_RANGE_SHIFT, NO_EXPERT, SCALE_BLOCK, X_DTYPES
from .handle_checks import check_low_latency_handles
from .ranks import _rank_offsets
from .results import LowLatencyDispatchResult, LowLatencyHandle, Rows

# --------------------------------------------------------------------------------------------
# Reference math (plain torch; vectorized over tokens, ranks concatenated)
# --------------------------------------------------------------------------------------------

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


@attrs.frozen
class SimulateLowLatencyDispatchInputs(Inputs):
    """One simulate_low_latency_dispatch call: every rank's tokens and routing."""

    xs: tuple[torch.Tensor, ...]
    topk_idx: tuple[torch.Tensor, ...]
    num_max_dispatch_tokens_per_rank: int
    num_experts: int
    use_fp8: bool
    round_scale: bool
    device_field = "xs"


@attrs.frozen
class SimulateLowLatencyCombineInputs(Inputs):
    """One simulate_low_latency_combine call: every rank's expert outputs, routing and handle parts."""

    xs: tuple[torch.Tensor, ...]
    topk_idx: tuple[torch.Tensor, ...]
    topk_weights: tuple[torch.Tensor, ...]
    recv_src_info: tuple[torch.Tensor, ...]
    recv_layout_range: tuple[torch.Tensor, ...]
    device_field = "xs"


SIMULATE_LOW_LATENCY_DISPATCH = register_contract(OpContract(
    "simulate_low_latency_dispatch", low_latency_dispatch_reference,
    Tolerance(dequantized=0.0, unquantized=FP8_DISPATCH_BOUND)))
SIMULATE_LOW_LATENCY_COMBINE = register_contract(OpContract(
    "simulate_low_latency_combine", low_latency_combine_reference, Tolerance(dequantized=COMBINE_BOUND)))


# --------------------------------------------------------------------------------------------
# Public ops
# --------------------------------------------------------------------------------------------

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
    # every rank receives [experts / R, M * R, hidden] rows: R such buffers live in this process
    check_allocation(op, "num_max_dispatch_tokens_per_rank", experts * max_tokens * num_ranks * data[0].shape[1],
                     data[0].element_size(), data[0].device, "pass the real maximum of tokens a rank dispatches")
    if use_fp8 and data[0].shape[1] % SCALE_BLOCK:
        raise ContractError(format_problem(op, "xs[0]", f"of hidden {data[0].shape[1]}",
                                           f"hidden divisible by {SCALE_BLOCK} with use_fp8",
                                           "pad hidden to a multiple of 128 or pass use_fp8=False"))
    if use_fp8 and round_scale:
        for r, x in enumerate(data):
            check_finite_for_round_scale(op, f"xs[{r}]", x)
    idx, _ = _check_topk_per_rank(op, topk_idx, None, [x.shape[0] for x in data], data[0].device, experts)
    out = run(SIMULATE_LOW_LATENCY_DISPATCH, SimulateLowLatencyDispatchInputs(tuple(data), tuple(idx), max_tokens,
                                                                             experts, use_fp8, round_scale))
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
    check_low_latency_handles(op, handles, idx)
    return list(run(SIMULATE_LOW_LATENCY_COMBINE, SimulateLowLatencyCombineInputs(
        tuple(xs), tuple(idx), tuple(weights), tuple(h.recv_src_info for h in handles),
        tuple(h.recv_layout_range for h in handles))))
