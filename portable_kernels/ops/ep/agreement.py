"""The first step of every distributed Buffer op: all ranks agree on the call before payload moves.

`agree()` all-gathers each rank's header (see `wire.py`) and checks, identically on every rank:
the peers run this protocol; all ranks are in the same op and call number; no rank refused its
own arguments; the settings that must match do match; every rank's staging fits its buffer; and
what each rank will send matches what its peer expects. Any failure raises the same kind of
typed error on every rank (the rank at fault re-raises its own, more specific error), so no rank
is left waiting in a payload collective. The rows each rank sends to each rank come back as the
`send` matrix, from which every rank knows every split.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs
import torch

from ...core.errors import ContractError
from .transport import Transport
from .wire import FORM_NAMES, MAGIC, UNKNOWN, Field, OpCode, header, split_headers

#: which header field is named how in messages (the Buffer argument it comes from)
FIELD_ARGS = {
    Field.NUM_EXPERTS: "num_experts", Field.HIDDEN: "hidden size of x", Field.FORM: "x's form",
    Field.NUM_TOPK: "num_topk (topk_idx.shape[1])", Field.HAS_WEIGHTS: "topk_weights given or not",
    Field.MAX_TOKENS: "num_max_dispatch_tokens_per_rank", Field.FLAGS: "use_fp8 / round_scale / use_ue8m0",
}


#: bytes of each refusing rank's message that the other ranks quote
REASON_BYTES = 512


@attrs.frozen
class Agreement:
    """What every rank learned: per-rank header fields, rows send[src][dst], and this rank's view."""

    fields: list[list[int]]
    send: list[list[int]]
    rank: int

    def recv_rows(self, rank: int | None = None) -> list[int]:
        """Rows rank `rank` (default: this one) receives from each source."""
        me = self.rank if rank is None else rank
        return [row[me] for row in self.send]

    def send_rows(self, rank: int | None = None) -> list[int]:
        return list(self.send[self.rank if rank is None else rank])

    def field(self, key: Field, rank: int | None = None) -> int:
        return self.fields[self.rank if rank is None else rank][key]


def _op_name(code: int) -> str:
    try:
        return OpCode(code).name.lower()
    except ValueError:
        return f"op #{code}"


def _show(key: Field, value: int) -> str:
    return FORM_NAMES.get(value, str(value)) if key == Field.FORM else str(value)


def _share_reasons(transport: Transport, op: str, local_error: BaseException | None, device: torch.device) -> list[str]:
    """On the error path only: every rank learns the first REASON_BYTES of each refusal's message."""
    text = b"" if local_error is None else str(local_error).encode("utf-8", "replace")[:REASON_BYTES]
    mine = torch.zeros(REASON_BYTES, dtype=torch.uint8)
    mine[:len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8) if text else mine[:0]
    gathered = transport.all_gather(mine.to(device), op).cpu()
    return [bytes(row.tolist()).rstrip(b"\0").decode("utf-8", "replace") for row in gathered]


def agree(transport: Transport, op: str, fields: dict[Field, int], send_rows: Sequence[int],
          expect_rows: Sequence[int] | None, device: torch.device, must_match: Sequence[Field],
          local_error: BaseException | None,
          budget_need: Callable[[Agreement, int], int] | None = None,
          send_marks: Sequence[int] | None = None, expect_marks: Sequence[int] | None = None) -> Agreement:
    """Exchange headers and check them (see the module docstring): propose(...).settle()."""
    return propose(transport, op, fields, send_rows, expect_rows, device, must_match, local_error, budget_need,
                   send_marks, expect_marks).settle()


def propose(transport: Transport, op: str, fields: dict[Field, int], send_rows: Sequence[int],
            expect_rows: Sequence[int] | None, device: torch.device, must_match: Sequence[Field],
            local_error: BaseException | None,
            budget_need: Callable[[Agreement, int], int] | None = None,
            send_marks: Sequence[int] | None = None, expect_marks: Sequence[int] | None = None) -> "Proposal":
    """Start the header all-gather; local work may run before `settle()` checks the answers.
    `budget_need(agreement, rank)` gives the bytes rank needs for this call, compared with its
    Field.BUDGET; marks are the row-order fingerprints a combine sends and expects."""
    num_ranks = transport.num_ranks
    if local_error is not None:
        fields = {**fields, Field.STATUS: 1}
        send_rows, expect_rows, send_marks, expect_marks = [0] * num_ranks, None, None, None
    pending = transport.start_all_gather(header(fields, send_rows, expect_rows, device, send_marks, expect_marks), op)
    return Proposal(transport, op, pending, device, tuple(must_match), local_error, budget_need)


@attrs.frozen(eq=False)
class Proposal:
    """A header all-gather in flight, and what settling it must check."""

    transport: Transport
    op: str
    pending: Any
    device: torch.device
    must_match: tuple[Field, ...]
    local_error: BaseException | None
    budget_need: Callable[[Agreement, int], int] | None

    def settle(self) -> Agreement:
        """Wait for every rank's header and run the checks of the module docstring."""
        return _settle(self)


def _settle(p: Proposal) -> Agreement:
    transport, op, device, must_match, local_error, budget_need = (p.transport, p.op, p.device, p.must_match,
                                                                   p.local_error, p.budget_need)
    num_ranks = transport.num_ranks
    headers = split_headers(p.pending.wait(), num_ranks)
    per_rank, send, expect = headers.fields, headers.send, headers.expect
    me = transport.rank
    where = f"process group {transport.description}"

    bad = [r for r in range(num_ranks) if per_rank[r][Field.MAGIC] != MAGIC]
    if bad:
        raise ContractError(f"{op}: rank(s) {bad} of {where} sent a header this protocol does not know "
                            "(another library or version in the same collective). Fix: run one portable_kernels "
                            "version on every rank and make the same Buffer calls in the same order.")
    calls = [(per_rank[r][Field.OP], per_rank[r][Field.SEQ]) for r in range(num_ranks)]
    if len(set(calls)) > 1:
        listing = ", ".join(f"rank {r}: {_op_name(o)} call #{s}" for r, (o, s) in enumerate(calls))
        raise ContractError(f"{op}: the ranks of {where} are not in the same Buffer call ({listing}). Fix: every "
                            "rank must make the same sequence of Buffer calls (dispatch, combine, ...).")
    refused = [r for r in range(num_ranks) if per_rank[r][Field.STATUS]]
    if refused:
        reasons = _share_reasons(transport, op, local_error, device)
        if local_error is not None:
            raise local_error
        listing = "; ".join(f"rank {r}: {reasons[r]}" for r in refused)
        raise ContractError(f"{op}: rank(s) {refused} of {where} refused their own arguments, so no rank moved any "
                            f"data ({listing}). Fix: correct the arguments on those ranks.")
    for key in must_match:
        values = [per_rank[r][key] for r in range(num_ranks)]
        if len(set(values)) > 1:
            listing = ", ".join(f"rank {r}: {_show(key, v)}" for r, v in enumerate(values))
            raise ContractError(f"{op}: argument '{FIELD_ARGS.get(key, key.name.lower())}' differs between the "
                                f"ranks of {where} ({listing}); expected one value on every rank. Fix: give every "
                                "rank the same model settings.")
    for dst in range(num_ranks):
        for src in range(num_ranks):
            wanted = expect[dst][src]
            if wanted != UNKNOWN and wanted != send[src][dst]:
                raise ContractError(
                    f"{op}: argument 'handle' does not match across {where}: rank {src} would send {send[src][dst]} "
                    f"rows to rank {dst}, which expects {wanted}. Fix: pass each rank the handle its own "
                    "dispatch of this same exchange returned (and, in low latency, the same topk_idx).")
            mark = headers.expect_marks[dst][src]
            if mark != UNKNOWN and mark != headers.send_marks[src][dst]:
                raise ContractError(
                    f"{op}: argument 'handle' does not match across {where}: rank {src} would return its rows to "
                    f"rank {dst} in another order (or for other tokens) than rank {dst} dispatched them. Fix: pass "
                    "each rank the handle its own dispatch returned and x in the order that dispatch returned.")
    agreement = Agreement(per_rank, send, me)
    if budget_need is not None:
        for r in range(num_ranks):
            need, have = budget_need(agreement, r), per_rank[r][Field.BUDGET]
            if need > have:
                raise ContractError(
                    f"{op}: the call needs {need} bytes of buffer on rank {r} of {where}, which has {have}. "
                    "Fix: build every rank's Buffer with enough bytes (num_nvl_bytes for normal mode, "
                    "num_rdma_bytes >= Buffer.get_low_latency_rdma_size_hint(...) for low latency), "
                    "or move fewer tokens per call.")
    return agreement
