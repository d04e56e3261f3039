"""Low-latency dispatch and combine over a transport, and the engine seam for fused vendor ops.

Dispatch: each token goes once to each rank holding any of its experts (one packed row: token
bytes — bf16, or its per-token FP8 cast and fp32 scales — the source index, and the token's top-k
ids as that rank's local ids), in one collective. The receiver copies each row into the slot of
every local expert it chose, in (source rank, source token) order, which gives DeepEP's masked
layout: recv_x [L, M·R, H] (FP8 scales fp32 [L, M·R, H/128] MN-major TMA-aligned, which the
Buffer packs to UE8M0 int32 [L, M·R, H/512] with use_ue8m0), recv_count [L], a LowLatencyHandle.
Combine: each valid slot goes back to its source rank with (token, expert) from the handle;
the source rank checks that these are exactly its routed (token, expert) pairs and adds
weight · row in fp32.

`LowLatencyEngine` is the seam: the Buffer calls an engine's `dispatch` / `combine` after its
per-rank argument checks. `AllToAllLowLatencyEngine` (here) runs on any Transport; an Ascend
MC2 engine (torch_npu's `npu_moe_distribute_dispatch_v2` / `combine_v2` on the group's HCCL
communicator) is the second implementation (the ascend backend's `vendor/mc2.py`; checked against a stand-in only).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import attrs
import torch

from ...core.errors import ContractError, format_problem
from ...layouts.fp8_scales import tma_aligned_mn
from ..quant.fp8 import per_token_cast_to_fp8
from .agreement import Agreement, Proposal, propose
from .constants import LAYOUT_RANGE_SHIFT, NO_EXPERT, SCALE_BLOCK
from .results import LowLatencyHandle, Rows
from .sizes import get_low_latency_rdma_size_hint
from .transport import Transport
from .wire import FORMS, Field, as_bytes, pack_rows, row_bytes, unpack_rows
from .workspace import Workspace


@attrs.frozen
class CallInfo:
    """Who is calling: the op name for messages, this Buffer's call number, and the per-rank
    argument error (if any) the engine must share with its peers before re-raising."""

    op: str
    seq: int
    op_code: int
    device: torch.device
    local_error: BaseException | None


class LowLatencyEngine(Protocol):
    """An implementation of DeepEP's low-latency pair for one rank of a group."""

    def dispatch(self, call: CallInfo, x: torch.Tensor | None, topk_idx: torch.Tensor | None,
                 num_max_dispatch_tokens_per_rank: int, num_experts: int, use_fp8: bool, round_scale: bool,
                 use_ue8m0: bool) -> tuple[Rows, torch.Tensor, LowLatencyHandle]:
        """-> (recv_x, recv_count int32 [L], handle) in DeepEP's masked layout: recv_x bf16
        [L, M*R, H], or with use_fp8 (fp8 [L, M*R, H], fp32 [L, M*R, H/128] scales of any strides,
        powers of two with round_scale); the Buffer packs UE8M0 or prepares for an op itself."""

    def combine(self, call: CallInfo, x: torch.Tensor | None, topk_idx: torch.Tensor | None,
                topk_weights: torch.Tensor | None, handle: LowLatencyHandle | None) -> torch.Tensor:
        """-> combined_x [T, H]: the weighted sum of each token's expert rows (fp32 accumulation)."""


def _flags(use_fp8: bool, round_scale: bool, use_ue8m0: bool) -> int:
    return int(use_fp8) | int(round_scale) << 1 | int(use_ue8m0) << 2


class AllToAllLowLatencyEngine:
    """Low-latency dispatch/combine as a header all-gather plus one all_to_all_single each."""

    def __init__(self, transport: Transport, budget: Callable[[], int], workspace: Workspace | None = None) -> None:
        self.transport = transport
        self.budget = budget
        self.workspace = workspace or Workspace()

    def _propose(self, call: CallInfo, fields: dict[Field, int], send: list[int], expect: list[int] | None,
                 device: torch.device, must: tuple[Field, ...], ll: bool) -> Proposal:
        fields = {**fields, Field.OP: call.op_code, Field.SEQ: call.seq, Field.BUDGET: self.budget()}

        def need(agreement: Agreement, rank: int) -> int:
            return get_low_latency_rdma_size_hint(agreement.field(Field.MAX_TOKENS, rank),
                                                  agreement.field(Field.HIDDEN, rank), self.transport.num_ranks,
                                                  agreement.field(Field.NUM_EXPERTS, rank))
        return propose(self.transport, call.op, fields, send, expect, device, must, call.local_error,
                       need if ll else None)

    # ---------------------------------------------------------------- dispatch

    def dispatch(self, call: CallInfo, x: Any, topk_idx: Any, num_max_dispatch_tokens_per_rank: int,
                 num_experts: int, use_fp8: bool, round_scale: bool, use_ue8m0: bool
                 ) -> tuple[Rows, torch.Tensor, LowLatencyHandle]:
        transport, num_ranks, device = self.transport, self.transport.num_ranks, call.device
        if call.local_error is not None:
            self._propose(call, {}, [0] * num_ranks, None, device, (), ll=False).settle()
            raise call.local_error  # settle() re-raises first; kept for readers
        per_rank = num_experts // num_ranks
        idx = topk_idx.long()
        owner = torch.where(idx >= 0, idx // per_rank, num_ranks)
        in_rank = torch.zeros((idx.shape[0], num_ranks + 1), dtype=torch.bool, device=device)
        in_rank.scatter_(1, owner, True)
        dest, token = in_rank[:, :num_ranks].T.nonzero(as_tuple=True)
        send = torch.bincount(dest, minlength=num_ranks).tolist()
        hidden, num_topk = x.shape[1], idx.shape[1]
        # a row: the token's bytes (bf16, or FP8 and its scales), its index, its global expert ids
        token_bytes = hidden + hidden // SCALE_BLOCK * 4 if use_fp8 else row_bytes(x)
        width = token_bytes + 4 + 4 * num_topk
        fields = {Field.NUM_EXPERTS: num_experts, Field.HIDDEN: hidden, Field.FORM: FORMS[x.dtype],
                  Field.NUM_TOPK: num_topk, Field.NUM_TOKENS: x.shape[0],
                  Field.MAX_TOKENS: num_max_dispatch_tokens_per_rank,
                  Field.FLAGS: _flags(use_fp8, round_scale, use_ue8m0), Field.ROW_BYTES: width}
        must = (Field.NUM_EXPERTS, Field.HIDDEN, Field.FORM, Field.NUM_TOPK, Field.MAX_TOKENS, Field.FLAGS)
        proposal = self._propose(call, fields, send, None, device, must, ll=True)
        if use_fp8:  # cast and pack while the header is in flight
            cast = per_token_cast_to_fp8(x, gran_k=SCALE_BLOCK, use_ue8m0=round_scale)
            parts = [cast.data, cast.scale]
        else:
            parts = [x]
        parts += [torch.arange(x.shape[0], dtype=torch.int32, device=device), topk_idx.to(torch.int32)]
        packed = self.workspace.take("ll-send", (token.numel(), width), torch.uint8, device)
        pack_rows(parts, token, out=packed)
        agreement = proposal.settle()
        recv_splits = agreement.recv_rows()
        rows = self.workspace.take("ll-recv", (sum(recv_splits), width), torch.uint8, device)
        transport.all_to_all(rows, packed, recv_splits, send, call.op)
        return _place(rows, parts, recv_splits, transport.rank, per_rank, num_max_dispatch_tokens_per_rank,
                      num_experts, use_fp8, device)

    # ---------------------------------------------------------------- combine

    def combine(self, call: CallInfo, x: Any, topk_idx: Any, topk_weights: Any, handle: Any) -> torch.Tensor:
        transport, num_ranks, device = self.transport, self.transport.num_ranks, call.device
        if call.local_error is not None:
            self._propose(call, {}, [0] * num_ranks, None, device, (), ll=False).settle()
            raise call.local_error
        per_rank = handle.num_experts // num_ranks
        src_rank = handle.recv_src_rank
        expert, slot = (src_rank >= 0).nonzero(as_tuple=True)
        source = src_rank[expert, slot].long()
        order = torch.sort(source, stable=True).indices  # by source rank, then (expert, slot)
        expert, slot, source = expert[order], slot[order], source[order]
        send = torch.bincount(source, minlength=num_ranks).tolist()
        idx = topk_idx.long()
        owner = torch.where(idx >= 0, idx // per_rank, num_ranks)
        expect = torch.bincount(owner.flatten(), minlength=num_ranks + 1)[:num_ranks].tolist()
        width = row_bytes(x[0]) + 8
        fields = {Field.NUM_EXPERTS: handle.num_experts, Field.HIDDEN: x.shape[-1], Field.FORM: FORMS[x.dtype],
                  Field.NUM_TOKENS: idx.shape[0], Field.MAX_TOKENS: handle.num_max_dispatch_tokens_per_rank,
                  Field.ROW_BYTES: width}
        must = (Field.NUM_EXPERTS, Field.HIDDEN, Field.FORM, Field.MAX_TOKENS)
        proposal = self._propose(call, fields, send, expect, device, must, ll=True)
        # rows out of their slots, with (token, global expert), while the header is in flight
        flat = expert * x.shape[1] + slot
        token = handle.recv_src_info[expert, slot].to(torch.int32)
        global_expert = (expert + transport.rank * per_rank).to(torch.int32)
        packed = self.workspace.take("ll-send", (flat.numel(), width), torch.uint8, device)
        torch.index_select(as_bytes(x.reshape(-1, x.shape[-1])), 0, flat, out=packed[:, :width - 8])
        packed[:, width - 8:] = pack_rows([token, global_expert])
        agreement = proposal.settle()
        recv_splits = agreement.recv_rows()
        received = self.workspace.take("ll-recv", (sum(recv_splits), packed.shape[1]), torch.uint8, device)
        transport.all_to_all(received, packed, recv_splits, send, call.op)
        back, tok, exp = unpack_rows(received, [(x.dtype, (x.shape[-1],)), (torch.int32, ()), (torch.int32, ())])
        return _weighted_sum(call.op, back, tok.view(-1).long(), exp.view(-1).long(), idx, topk_weights, x.dtype)


def _place(rows: torch.Tensor, parts: list[torch.Tensor], recv_splits: list[int], rank: int, per_rank: int,
           max_tokens: int, num_experts: int, use_fp8: bool, device: torch.device
           ) -> tuple[Rows, torch.Tensor, LowLatencyHandle]:
    """Copy received rows (packed like `parts`) into expert slots; slots of an expert follow
    (source rank, source token)."""
    data_width = row_bytes(parts[0])
    small = unpack_rows(rows[:, data_width:], [(p.dtype, tuple(p.shape[1:])) for p in parts[1:]])
    scales = small[0] if use_fp8 else None
    src, ids = small[-2].view(-1), small[-1].long()
    num_ranks, hidden = len(recv_splits), parts[0].shape[1]
    num_slots = max_tokens * num_ranks
    local = ids - rank * per_rank  # outside [0, L): another rank's expert, or none
    hits = (local[:, :, None] == torch.arange(per_rank, device=device)).any(dim=1)  # [N, L]
    expert, row = hits.T.nonzero(as_tuple=True)  # expert-major, rows (= source rank, token) ascending
    recv_count = hits.sum(dim=0)
    pos = torch.arange(expert.numel(), device=device) - (recv_count.cumsum(0) - recv_count)[expert]

    recv_x = torch.empty((per_rank, num_slots, hidden), dtype=parts[0].dtype, device=device)
    recv_x.view(torch.uint8)[expert, pos] = rows[row, :data_width]
    info = torch.full((per_rank, num_slots), NO_EXPERT, dtype=torch.int32, device=device)
    info[expert, pos] = src[row]
    source = torch.repeat_interleave(torch.arange(num_ranks, device=device), torch.tensor(recv_splits, device=device))
    count = torch.bincount(expert * num_ranks + source[row], minlength=per_rank * num_ranks).view(per_rank, num_ranks)
    layout_range = ((count.cumsum(1) - count) << LAYOUT_RANGE_SHIFT) | count
    handle = LowLatencyHandle(info, layout_range, max_tokens, hidden, num_experts)
    recv_count = recv_count.to(torch.int32)
    if scales is None:
        return recv_x, recv_count, handle
    num_blocks = hidden // SCALE_BLOCK
    # fp32 MN-major with TMA-aligned rows (DeepEP's column-major scales), written in place; unused
    # slots hold 1.0, a power of two, so the UE8M0 packing of the Buffer accepts every slot
    storage = torch.ones((per_rank, num_blocks, tma_aligned_mn(num_slots)), dtype=torch.float32, device=device)
    recv_scales = storage[:, :, :num_slots].transpose(1, 2)
    recv_scales[expert, pos] = scales[row]
    return (recv_x, recv_scales), recv_count, handle


def _weighted_sum(op: str, rows: torch.Tensor, token: torch.Tensor, expert: torch.Tensor, topk_idx: torch.Tensor,
                  topk_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Σ weight · row per token in fp32, after checking the returned (token, expert) pairs are
    exactly this rank's routed pairs, each once."""
    num_tokens, num_topk = topk_idx.shape
    in_range = (token >= 0) & (token < num_tokens)
    safe = torch.where(in_range, token, 0)
    match = (topk_idx[safe] == expert[:, None]) & in_range[:, None]  # [S, k]
    slot = match.to(torch.int8).argmax(dim=1)
    position = safe * num_topk + slot
    routed = int((topk_idx >= 0).sum())
    seen = torch.bincount(position[match.any(dim=1)], minlength=num_tokens * num_topk)
    if not bool(match.any(dim=1).all()) or rows.shape[0] != routed or bool((seen > 1).any()):
        raise ContractError(format_problem(op, "handle", "returning rows for (token, expert) pairs this rank's "
                                           "topk_idx did not route", "each routed (token, expert) pair exactly once",
                                           "pass every rank the handle of its own low_latency_dispatch and the "
                                           "topk_idx given to it"))
    weight = topk_weights.reshape(-1)[position]
    out = torch.zeros((num_tokens, rows.shape[1]), dtype=torch.float32, device=rows.device)
    out.index_add_(0, token, rows.float() * weight[:, None])
    return out.to(dtype)
