"""The lower-bound time of one MoE layer's expert-parallel exchange (one dispatch + one combine).

Each call is one or two phases — the Buffer's header exchange, then the payload — and a phase
lasts, on its slowest rank r:

    latency(r) + transfer(r)
    latency(r)  = the largest hops x hop latency over the tiers r talks on + messages(r) x message overhead
    transfer(r) = max( max over tiers t of max(send[r, t], recv[r, t]) / bandwidth[t],
                       bytes all ranks send on t / aggregate bandwidth[t]   (tiers that state one),
                       rows r keeps / local copy bandwidth                  (fabrics that state one) )

The assumptions behind it are listed in `ASSUMPTIONS` (and printed by the CLI): full-duplex
links, separate links per tier, non-blocking switches unless a tier states an aggregate limit,
all messages of a phase in flight together, no overlap with compute or between calls, the
Buffer's own CPU/GPU work not counted. It is a bound a real exchange can approach, not a forecast.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import attrs
import torch

from ...core.errors import ContractError, format_problem
from .fabric import GB, Fabric
from .routing import RoutingSpec, RowCounts, row_counts
from .shape import BUFFER_EXCHANGE, Exchange, MoEShape
from .traffic import CALLS, CallTraffic, call_traffic

ASSUMPTIONS = (
    "links are full duplex: a rank sends and receives at a tier's bandwidth at the same time",
    "tiers have separate links (scale-up and scale-out transfers of a rank run concurrently); a row "
    "travels once, on the innermost tier shared by its two ranks (flat all-to-all: no forwarding or "
    "per-node deduplication as in DeepEP's internode kernels)",
    "switches are non-blocking unless a tier states an aggregate bandwidth",
    "all messages of a phase are in flight together: a phase pays one latency (hops x hop latency of the "
    "farthest tier used) plus the fabric's per-message overhead for each message the rank sends",
    "a call is the Buffer's header exchange, then its payload (token rows and metadata side by side); "
    "dispatch and combine run one after the other, with no compute overlapped",
    "the Buffer's own work (packing, the combine's fp32 accumulation) is not counted",
    "rows a rank sends to itself cost nothing unless the fabric states a local copy bandwidth",
    "ranks are placed contiguously (rank r in domain r // ranks of each tier) and own E/R consecutive "
    "experts, as get_dispatch_layout assumes",
)


@attrs.frozen
class PhaseCost:
    """One phase on its slowest rank: seconds = latency + transfer; bound names the binding term."""

    name: str
    seconds: float
    rank: int
    latency: float
    transfer: float
    bound: str


@attrs.frozen(eq=False)
class CallCost:
    traffic: CallTraffic
    phases: tuple[PhaseCost, ...]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def counted_bandwidth(self) -> float:
        """DeepEP's figure: the mean rank's counted bytes over the call's time, bytes/s."""
        seconds = self.seconds
        return float(self.traffic.counted.mean()) / seconds if seconds > 0 else float("inf")


@attrs.frozen(eq=False)
class LayerCost:
    """One MoE layer's exchange: its shape, fabric, routing and both calls."""

    shape: MoEShape
    fabric: Fabric
    exchange: Exchange
    routing: str
    counts: RowCounts
    dispatch: CallCost
    combine: CallCost

    @property
    def num_ranks(self) -> int:
        return self.counts.num_ranks

    @property
    def seconds(self) -> float:
        return self.dispatch.seconds + self.combine.seconds

    def call(self, kind: str) -> CallCost:
        return self.dispatch if kind == "dispatch" else self.combine

    @property
    def assumptions(self) -> tuple[str, ...]:
        return ASSUMPTIONS


def _phase(name: str, fabric: Fabric, send: torch.Tensor, recv: torch.Tensor, local: torch.Tensor,
           messages: torch.Tensor) -> PhaseCost:
    """The slowest rank's latency + transfer for one phase ([R, n_tiers] bytes per tier)."""
    num_ranks = send.shape[0]
    terms: list[tuple[str, torch.Tensor]] = []
    for t, tier in enumerate(fabric.tiers):
        terms.append((f"{tier.name} bandwidth", torch.maximum(send[:, t], recv[:, t]) / tier.bandwidth))
        if tier.aggregate_bandwidth is not None:
            total = float(send[:, t].sum()) / tier.aggregate_bandwidth
            terms.append((f"{tier.name} aggregate bandwidth", torch.full((num_ranks,), total, dtype=torch.float64)))
    if fabric.local_bandwidth is not None:
        terms.append(("local copy", local / fabric.local_bandwidth))
    stacked = torch.stack([v for _, v in terms], dim=1)
    transfer, which = stacked.max(dim=1)
    used = (send > 0) | (recv > 0)
    tier_latency = torch.tensor([t.latency for t in fabric.tiers], dtype=torch.float64)
    latency = (used.double() * tier_latency).max(dim=1).values + messages * fabric.message_overhead
    total = latency + transfer
    rank = int(total.argmax())
    if float(total[rank]) == 0.0:
        bound = "nothing to move"  # one rank, or no rows off the rank
    elif float(transfer[rank]) >= float(latency[rank]):
        bound = terms[int(which[rank])][0]
    else:
        bound = "latency"
    return PhaseCost(name, float(total[rank]), rank, float(latency[rank]), float(transfer[rank]), bound)


def call_cost(kind: str, shape: MoEShape, counts: RowCounts, fabric: Fabric, exchange: Exchange) -> CallCost:
    traffic = call_traffic(kind, shape, counts, fabric, exchange)
    phases = []
    if exchange.header:
        phases.append(_phase("header", fabric, traffic.header_send, traffic.header_recv,
                             torch.zeros_like(traffic.local), traffic.header_messages))
    phases.append(_phase("payload", fabric, traffic.send, traffic.recv, traffic.local, traffic.messages))
    return CallCost(traffic, tuple(phases))


Routing = Union[RoutingSpec, Sequence[torch.Tensor]]


def layer_counts(shape: MoEShape, num_ranks: int, routing: Routing = RoutingSpec()) -> RowCounts:
    """The routing's rows per (source, destination) rank: drawn from a RoutingSpec, or from given
    per-rank topk_idx tensors (one [T, k] per rank), through get_dispatch_layout."""
    if isinstance(routing, RoutingSpec):
        return row_counts(routing.topk_idx(shape, num_ranks), shape.num_experts)
    ids = list(routing)
    if len(ids) != num_ranks:
        raise ContractError(format_problem("ep_cost", "topk_idx", f"a list of {len(ids)} tensors",
                                           f"{num_ranks} (one per rank of the EP degree)",
                                           "pass one topk_idx per rank, in rank order"))
    for r, t in enumerate(ids):
        if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[1] != shape.num_topk:
            raise ContractError(format_problem("ep_cost", f"topk_idx[{r}]", f"top-{t.shape[1]} ids",
                                               f"top-{shape.num_topk} (the shape's num_topk)",
                                               "make MoEShape.num_topk match the ids' second dimension"))
    return row_counts(ids, shape.num_experts)


def describe_routing(routing: Routing) -> str:
    return routing.describe() if isinstance(routing, RoutingSpec) else "given topk_idx"


def estimate(shape: MoEShape, fabric: Fabric, num_ranks: int, routing: Routing = RoutingSpec(),
             exchange: Exchange = BUFFER_EXCHANGE, counts: Optional[RowCounts] = None) -> LayerCost:
    """Bytes and lower-bound time of one dispatch + combine at EP degree num_ranks.

    routing: a RoutingSpec (drawn per rank) or the per-rank topk_idx; counts: precomputed
    `layer_counts` (to reuse one routing across fabrics)."""
    fabric.check_ranks(num_ranks)
    if counts is None:
        counts = layer_counts(shape, num_ranks, routing)
    elif counts.num_ranks != num_ranks:
        raise ContractError(format_problem("ep_cost", "counts", f"counts of {counts.num_ranks} ranks",
                                           f"{num_ranks} ranks", "compute the counts at the same EP degree"))
    calls = {kind: call_cost(kind, shape, counts, fabric, exchange) for kind in CALLS}
    return LayerCost(shape, fabric, exchange, describe_routing(routing), counts, calls["dispatch"],
                     calls["combine"])


def gbps(bytes_per_second: float) -> float:
    return bytes_per_second / GB
