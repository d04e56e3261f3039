"""Bytes per rank per call: what one dispatch and one combine of the Buffer put on each tier.

From the routing's rows[s][d] (tokens of rank s reaching rank d, `routing.row_counts`) and the
fabric's tier of each (s, d) pair: a dispatch sends rows[s][d] rows of `dispatch_row_bytes` (+ the
Buffer's per-row metadata) from s to d; a combine sends the same rows back from d to s as bf16
(+ weights when the combine returns them). Rows a rank keeps (d == s) stay local. With the
Buffer's exchange, each call first sends its int64 header to every peer. The DeepEP-counted bytes
are the ones DeepEP's benchmarks divide by time: the dispatch's received rows (recv_x, self
included) at bf16 size x (1 + 4/128)/2 for FP8, and the same rows at bf16 size for the combine.
"""

from __future__ import annotations

from typing import Literal

import attrs
import torch

from ...core.errors import ContractError, format_problem
from .fabric import Fabric
from .routing import RowCounts
from .shape import Exchange, MoEShape, header_bytes

CallKind = Literal["dispatch", "combine"]
CALLS: tuple[str, ...] = ("dispatch", "combine")


@attrs.frozen(eq=False)
class CallTraffic:
    """One call's bytes, per rank (rows) and per tier (columns of the [R, n_tiers] tensors, float64).

    send / recv: payload bytes (token rows + metadata) a rank sends to / receives from peers on each
    tier; local: bytes of rows a rank keeps ([R]); header_send / header_recv: the header exchange's
    bytes per tier; messages: payload messages a rank sends ([R]: peers with rows x collectives);
    header_messages: header messages a rank sends ([R]); counted: DeepEP-counted bytes ([R]);
    token_send: the token part of `send` (rows without metadata), per tier; peer: payload bytes
    from rank s to rank d ([R, R], the diagonal = `local`); header_peer: header bytes per peer.
    """

    kind: str
    tier_names: tuple[str, ...]
    send: torch.Tensor
    recv: torch.Tensor
    local: torch.Tensor
    header_send: torch.Tensor
    header_recv: torch.Tensor
    messages: torch.Tensor
    header_messages: torch.Tensor
    counted: torch.Tensor
    token_send: torch.Tensor
    peer: torch.Tensor
    header_peer: int
    row_bytes: int
    token_row_bytes: int

    @property
    def num_ranks(self) -> int:
        return self.send.shape[0]

    def total_send(self) -> torch.Tensor:
        """[R]: every byte a rank puts on the fabric (payload + header, all tiers)."""
        return self.send.sum(dim=1) + self.header_send.sum(dim=1)

    def total_recv(self) -> torch.Tensor:
        return self.recv.sum(dim=1) + self.header_recv.sum(dim=1)


def call_traffic(kind: str, shape: MoEShape, counts: RowCounts, fabric: Fabric, exchange: Exchange) -> CallTraffic:
    """The bytes of one dispatch (kind="dispatch") or combine ("combine") on every rank."""
    num_ranks = counts.num_ranks
    tiers = fabric.tier_matrix(num_ranks)
    rows = counts.rows.double()
    if kind == "dispatch":
        token_row = shape.dispatch_row_bytes
        extra = exchange.dispatch_metadata_bytes(shape)
        # the Buffer moves token rows and metadata rows (FP8 scales among them) in two concurrent collectives
        collectives = 2 if exchange.metadata else 1
        flow = rows                      # flow[s][d]: rows s sends to d
    elif kind == "combine":
        token_row = shape.combine_row_bytes
        extra = exchange.combine_extra_bytes(shape)
        collectives = 2 if exchange.combine_weights else 1
        flow = rows.T                    # d returns to s the rows it received from s
    else:
        raise ContractError(format_problem("call_traffic", "kind", repr(kind), f"one of {CALLS}",
                                           "pass 'dispatch' or 'combine'"))
    row = token_row + extra
    num_tiers = len(fabric.tiers)
    send = torch.zeros(num_ranks, num_tiers, dtype=torch.float64)
    recv = torch.zeros_like(send)
    peers = torch.zeros_like(send)
    for t in range(num_tiers):
        on_tier = (tiers == t).double()
        send[:, t] = (flow * on_tier).sum(dim=1)
        recv[:, t] = (flow * on_tier).sum(dim=0)
        peers[:, t] = on_tier.sum(dim=1)
    off_diagonal = ~torch.eye(num_ranks, dtype=torch.bool)
    messages = ((flow > 0) & off_diagonal).sum(dim=1).double() * collectives
    per_header = header_bytes(num_ranks) if exchange.header else 0
    header_messages = torch.full((num_ranks,), float(num_ranks - 1 if exchange.header else 0), dtype=torch.float64)
    received_rows = rows.sum(dim=0)      # recv_x rows of each rank, its own included
    counted = received_rows * (shape.dispatch_row_bytes if kind == "dispatch" else shape.combine_row_bytes)
    return CallTraffic(kind, tuple(t.name for t in fabric.tiers), send * row, recv * row, flow.diagonal() * row,
                       peers * per_header, peers * per_header, messages, header_messages, counted,
                       send * token_row, flow * row, per_header, row, token_row)
