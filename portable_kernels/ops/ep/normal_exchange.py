"""Normal-mode dispatch and combine over a transport (one rank's side of the exchange).

Dispatch: each token goes once to each rank in its `is_token_in_rank` row, in (destination,
token) order, so every rank receives rows ordered by source rank, then source token — DeepEP's
order. Two payload collectives: the token rows (received straight into `recv_x`, no unpacking
copy), and one packed metadata row per token (FP8 scales, top-k ids and weights, source index).
Combine sends the received rows back in the order they arrived (straight from x, no packing) and
each source rank adds the returned rows of each token in fp32. Before any row moves, the header
carries fingerprints of the source indices each rank will return and of the tokens each rank
sent, so a handle from another dispatch or rows in another order are refused on every rank.

Each op is split in `plan_*` (local: validate, order, count; builds the header) and `run_*`
(after every rank agreed: move the payload). Argument validation lives in the Buffer.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ...core.errors import ContractError, format_problem
from ...layouts.moe import aligned_counts
from .agreement import Agreement
from .results import DispatchHandle
from .rows import (COMBINE_ROWS, PACK_DISPATCH_ROWS, UNPACK_DISPATCH_META, CombineInputs, PackInputs, UnpackInputs,
                   run_rows)
from .transport import Transport
from .workspace import Workspace
from .wire import FORMS, Field, as_bytes, fingerprints, row_bytes


@attrs.frozen(eq=False)
class DispatchPlan:
    """One rank's dispatch, ready to run: what goes where and what the header says."""

    x: torch.Tensor                      # token data [T, H] (fp8 data for an FP8 pair)
    scales: torch.Tensor | None          # fp32 [T, H/128] for FP8
    is_token_in_rank: torch.Tensor       # bool [T, R]
    dest_token: torch.Tensor             # int64 [S]: the token of each sent row, destination-major
    send_rows: list[int]
    topk_idx: torch.Tensor | None
    topk_weights: torch.Tensor | None
    num_experts: int                     # 0 in a cached dispatch
    num_tokens_per_expert: torch.Tensor | None
    expert_alignment: int
    num_worst_tokens: int
    handle: DispatchHandle | None        # the cached handle
    fields: dict[Field, int]
    expect_rows: list[int] | None
    must_match: tuple[Field, ...]


def _meta_parts(plan: DispatchPlan) -> list[torch.Tensor]:
    """Per-token metadata travelling beside the rows: scales, ids, weights; then (a dispatch that
    makes a handle, `_with_src`) the int32 source index, which the pack writes itself."""
    parts = [] if plan.scales is None else [plan.scales]
    if plan.handle is None and plan.topk_idx is not None:
        parts.append(plan.topk_idx)
        if plan.topk_weights is not None:
            parts.append(plan.topk_weights)
    return parts


def _with_src(plan: DispatchPlan) -> bool:
    return plan.handle is None


def _meta_bytes(plan: DispatchPlan) -> int:
    return sum(row_bytes(p) for p in _meta_parts(plan)) + (4 if _with_src(plan) else 0)


def plan_dispatch(x: torch.Tensor, scales: torch.Tensor | None, is_token_in_rank: torch.Tensor,
                  topk_idx: torch.Tensor | None, topk_weights: torch.Tensor | None, num_experts: int,
                  num_tokens_per_expert: torch.Tensor | None, expert_alignment: int, num_worst_tokens: int,
                  handle: DispatchHandle | None, budget: int) -> DispatchPlan:
    num_ranks = is_token_in_rank.shape[1]
    dest, token = is_token_in_rank.T.nonzero(as_tuple=True)
    send_rows = torch.bincount(dest, minlength=num_ranks).tolist()
    expect = None
    if handle is not None:
        ends = handle.rank_prefix_matrix[:, handle.rank].long()
        expect = (ends - torch.cat((ends.new_zeros(1), ends[:-1]))).tolist()
    plan = DispatchPlan(x, scales, is_token_in_rank, token, send_rows, topk_idx, topk_weights, num_experts,
                        num_tokens_per_expert, expert_alignment, num_worst_tokens, handle, {}, expect, ())
    meta_bytes = _meta_bytes(plan)
    fields = {Field.NUM_EXPERTS: num_experts, Field.HIDDEN: x.shape[1],
              Field.FORM: FORMS["fp8" if scales is not None else x.dtype],
              Field.NUM_TOPK: 0 if topk_idx is None else topk_idx.shape[1],
              Field.HAS_WEIGHTS: int(topk_weights is not None), Field.NUM_TOKENS: x.shape[0],
              Field.BUDGET: budget, Field.MAX_TOKENS: num_worst_tokens,
              Field.ROW_BYTES: row_bytes(x) + meta_bytes}
    must = (Field.HIDDEN, Field.FORM, Field.NUM_TOPK, Field.HAS_WEIGHTS, Field.ROW_BYTES)
    if handle is None:
        must += (Field.NUM_EXPERTS,)
    return attrs.evolve(plan, fields=fields, must_match=must)


def staging_need(agreement: Agreement, rank: int) -> int:
    """Bytes rank stages for this call: the larger of its sent and received rows, at the call's row size."""
    sent, received = sum(agreement.send_rows(rank)), sum(agreement.recv_rows(rank))
    return max(sent, received) * agreement.field(Field.ROW_BYTES, rank)


def _check_worst_tokens(op: str, agreement: Agreement, description: str) -> None:
    """Every rank knows every rank's receive count, so this refusal happens on all ranks alike."""
    for r in range(len(agreement.send)):
        worst, received = agreement.field(Field.MAX_TOKENS, r), sum(agreement.recv_rows(r))
        if worst and received > worst:
            raise ContractError(format_problem(op, "num_worst_tokens", f"{worst} on rank {r} of {description}",
                                               f"at least the {received} rows that rank receives",
                                               "raise num_worst_tokens (num_tokens * num_ranks always fits)"))


@attrs.frozen(eq=False)
class StagedDispatch:
    """The send side packed (while the header is in flight): token rows and their metadata rows."""

    rows: torch.Tensor                   # uint8 [rows sent through the collective, row bytes], destination-major
    meta: torch.Tensor | None            # uint8 [S, metadata bytes] or None
    own_later: bool                      # the own block is left out of rows: packed straight into recv_x


def _skips_self(me: int, num_ranks: int, own_rows: int) -> bool:
    """Whether this rank's rows to itself stay out of the collective: when its block is the first or
    last of both the send and the receive order (ranks 0 and R-1), so the others' blocks stay
    contiguous. A backend's copy to self is slower than a plain copy (on Gloo by an order of
    magnitude: benchmarks/ep_bench.py --primitives)."""
    return num_ranks > 1 and own_rows > 0 and me in (0, num_ranks - 1)


def _pack(plan: DispatchPlan, blocks: list[torch.Tensor | None], meta: torch.Tensor | None) -> None:
    run_rows(PACK_DISPATCH_ROWS, PackInputs(plan.x, tuple(p.contiguous() for p in _meta_parts(plan)), _with_src(plan),
                                            plan.is_token_in_rank, plan.dest_token, tuple(plan.send_rows),
                                            tuple(blocks), meta))


def stage_dispatch(plan: DispatchPlan, workspace: Workspace, me: int) -> StagedDispatch:
    """Pack every destination's rows but, on ranks 0 and R-1, this rank's own (`_skips_self`:
    they never enter the collective and are packed into recv_x once it exists, `run_dispatch`)."""
    device, sent, num_ranks = plan.x.device, plan.dest_token.numel(), len(plan.send_rows)
    own_later = _skips_self(me, num_ranks, plan.send_rows[me])
    through = sent - (plan.send_rows[me] if own_later else 0)
    width = row_bytes(plan.x)
    rows = workspace.take("dispatch-send", (through, width), torch.uint8, device)
    blocks: list[torch.Tensor | None] = []
    start = 0
    for d, count in enumerate(plan.send_rows):
        if own_later and d == me:
            blocks.append(None)
            continue
        blocks.append(rows[start:start + count])
        start += count
    meta_bytes = _meta_bytes(plan)
    # a cached bf16 dispatch moves the rows alone
    meta = workspace.take("dispatch-meta-send", (sent, meta_bytes), torch.uint8, device) if meta_bytes else None
    _pack(plan, blocks, meta)
    return StagedDispatch(rows, meta, own_later)


def _start_rows(transport: Transport, op: str, plan: DispatchPlan, staged: StagedDispatch, out: torch.Tensor,
                out_splits: list[int]) -> Any:
    """all_to_all of the row blocks; ranks 0 and R-1 pack their own block into out themselves
    while the collective moves the others' (disjoint rows of out)."""
    me, in_splits = transport.rank, plan.send_rows
    if not staged.own_later:
        return transport.start_all_to_all(out, staged.rows, out_splits, in_splits, op)
    own = in_splits[me]
    others_out = out[own:] if me == 0 else out[:out.shape[0] - own]
    splits_out, splits_in = list(out_splits), list(in_splits)
    splits_out[me] = splits_in[me] = 0
    pending = transport.start_all_to_all(others_out, staged.rows, splits_out, splits_in, op)
    blocks: list[torch.Tensor | None] = [None] * len(in_splits)
    blocks[me] = out[:own] if me == 0 else out[out.shape[0] - own:]
    _pack(plan, blocks, None)
    return pending


def run_dispatch(transport: Transport, op: str, plan: DispatchPlan, staged: StagedDispatch, agreement: Agreement,
                 workspace: Workspace) -> tuple[Any, ...]:
    """Move the rows; returns DeepEP's (recv_x, recv_topk_idx, recv_topk_weights, counts, handle)."""
    _check_worst_tokens(op, agreement, transport.description)
    device, me, num_ranks = plan.x.device, transport.rank, transport.num_ranks
    recv_splits = agreement.recv_rows()
    received = sum(recv_splits)
    rows = max(received, plan.num_worst_tokens)

    recv_x = torch.empty((rows, plan.x.shape[1]), dtype=plan.x.dtype, device=device)
    recv_bytes = as_bytes(recv_x[:received])
    # both collectives in flight at once: the metadata rides beside the rows
    moving = [_start_rows(transport, op, plan, staged, recv_bytes, recv_splits)]
    if staged.meta is not None:
        meta = workspace.take("dispatch-meta", (received, staged.meta.shape[1]), torch.uint8, device)
        moving.append(transport.start_all_to_all(meta, staged.meta, recv_splits, plan.send_rows, op))
    for pending in moving:
        pending.wait()
    scales = recv_idx = recv_w = counts = src_idx = None
    if staged.meta is not None:
        topk = plan.topk_idx if plan.handle is None else None
        scales, recv_idx, recv_w, counts, src_idx = run_rows(UNPACK_DISPATCH_META, UnpackInputs(
            meta, 0 if plan.scales is None else plan.scales.shape[1], None if topk is None else topk.dtype,
            0 if topk is None else topk.shape[1], plan.topk_weights is not None, _with_src(plan), me,
            plan.num_experts // num_ranks, rows))
    out_x = recv_x if scales is None else (recv_x, scales)
    if plan.handle is not None:
        return out_x, None, None, None, None

    if plan.topk_idx is None:
        counts = _exchange_expert_counts(transport, op, plan, plan.num_experts // num_ranks)
    prefix = torch.tensor(agreement.send, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
    handle = DispatchHandle(me, prefix, src_idx, plan.is_token_in_rank, plan.num_worst_tokens)
    listed = [] if plan.num_worst_tokens else [int(c) for c in aligned_counts(counts.cpu(), plan.expert_alignment)]
    return out_x, recv_idx, recv_w, listed, handle


def _exchange_expert_counts(transport: Transport, op: str, plan: DispatchPlan, per_rank: int) -> torch.Tensor:
    """Without topk_idx the receiver cannot count per expert: each rank sends its
    num_tokens_per_expert slice to the rank owning those experts (DeepEP's rule)."""
    num_ranks = transport.num_ranks
    mine = plan.num_tokens_per_expert.to(torch.int64).view(num_ranks, per_rank).contiguous()
    theirs = torch.empty_like(mine)
    transport.all_to_all(theirs, mine, [1] * num_ranks, [1] * num_ranks, op)
    return theirs.sum(dim=0)


@attrs.frozen(eq=False)
class CombinePlan:
    x: torch.Tensor                      # [N, H]: the received rows, in dispatch order
    handle: DispatchHandle
    topk_weights: torch.Tensor | None    # fp32 [N, k]
    biases: tuple[torch.Tensor, ...]
    sent_tokens: torch.Tensor            # int64: this rank's tokens in the order it dispatched them
    send_rows: list[int]                 # rows back to each source rank
    expect_rows: list[int]               # rows this rank sent to each rank at dispatch
    send_marks: list[int]                # fingerprint of the source indices returned to each rank
    expect_marks: list[int]              # fingerprint of the tokens this rank sent to each rank
    fields: dict[Field, int]
    must_match: tuple[Field, ...] = (Field.HIDDEN, Field.FORM, Field.NUM_TOPK, Field.HAS_WEIGHTS, Field.ROW_BYTES)


def plan_combine(x: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor | None,
                 biases: tuple[torch.Tensor, ...], budget: int) -> CombinePlan:
    received = handle.recv_src_idx.shape[0]
    x, topk_weights = x[:received], None if topk_weights is None else topk_weights[:received]
    ends = handle.rank_prefix_matrix[:, handle.rank].long()
    send_rows = (ends - torch.cat((ends.new_zeros(1), ends[:-1]))).tolist()
    dest, sent_tokens = handle.is_token_in_rank.T.nonzero(as_tuple=True)
    expect_rows = torch.bincount(dest, minlength=len(send_rows)).tolist()
    send_marks = fingerprints(handle.recv_src_idx, send_rows)
    expect_marks = fingerprints(sent_tokens, expect_rows)
    meta = 0 if topk_weights is None else row_bytes(topk_weights)
    fields = {Field.HIDDEN: x.shape[1], Field.FORM: FORMS[x.dtype],
              Field.NUM_TOPK: 0 if topk_weights is None else topk_weights.shape[1],
              Field.HAS_WEIGHTS: int(topk_weights is not None), Field.NUM_TOKENS: handle.num_tokens,
              Field.BUDGET: budget, Field.ROW_BYTES: row_bytes(x) + meta}
    return CombinePlan(x, handle, topk_weights, biases, sent_tokens, send_rows, expect_rows, send_marks, expect_marks,
                       fields)


def run_combine(transport: Transport, op: str, plan: CombinePlan, agreement: Agreement, workspace: Workspace
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rows come back in the order this rank dispatched its tokens (the header's fingerprints
    proved it on every rank), so they are added at `sent_tokens` without source indices. The rows
    this rank returns to itself stay out of the collective; per token the fp32 sum runs over this
    rank's rows first, then the other ranks' in rank order (ep_combine_rows, rows.py)."""
    device, me, hidden = plan.x.device, transport.rank, plan.x.shape[1]
    recv_splits = agreement.recv_rows()
    returned = sum(recv_splits)
    own_x = sum(plan.send_rows[:me])        # this rank's own rows: a block of x
    # the own block never enters the collective: it is added straight from x (rows.py)
    others = returned - recv_splits[me]
    rows = workspace.take("combine-recv", (others, hidden), plan.x.dtype, device)
    x_bytes = as_bytes(plan.x)
    if own_x == 0 or own_x + recv_splits[me] == plan.x.shape[0]:  # the own block is at an end of x
        send = x_bytes[recv_splits[me]:] if own_x == 0 else x_bytes[:own_x]
    else:
        send = workspace.take("combine-send", (plan.x.shape[0] - recv_splits[me], x_bytes.shape[1]), torch.uint8,
                              device)
        send[:own_x] = x_bytes[:own_x]
        send[own_x:] = x_bytes[own_x + recv_splits[me]:]
    out_splits, in_splits = list(recv_splits), list(plan.send_rows)
    out_splits[me] = in_splits[me] = 0
    moving = [transport.start_all_to_all(as_bytes(rows), send, out_splits, in_splits, op)]
    back = None
    if plan.topk_weights is not None:
        back = workspace.take("combine-weights", (returned, plan.topk_weights.shape[1]), torch.float32, device)
        moving.append(transport.start_all_to_all(back, plan.topk_weights.contiguous(), recv_splits, plan.send_rows,
                                                 op))
    num_tokens = plan.handle.num_tokens

    def wait() -> None:  # idempotent: each collective is waited for once
        while moving:
            moving.pop(0).wait()

    combined = run_rows(COMBINE_ROWS, CombineInputs(plan.x[own_x:own_x + recv_splits[me]], rows, tuple(recv_splits), me,
                                                    plan.sent_tokens, plan.handle.is_token_in_rank, plan.biases, wait,
                                                    workspace))
    wait()  # a no-op when the kernel waited already
    weights = None
    if back is not None:
        weights = torch.zeros((num_tokens, back.shape[1]), dtype=torch.float32, device=device)
        weights.index_add_(0, plan.sent_tokens, back)
    return combined, weights
