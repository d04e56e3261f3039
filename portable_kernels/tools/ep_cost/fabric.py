"""The fabric side of the cost model: tiers of links, each with a domain size, a per-rank
bandwidth and a latency per hop.

A `Fabric` is a list of `Tier`s from the innermost (e.g. the NVLink node, the UB scale-up domain)
to the outermost (the scale-out network). Ranks are placed contiguously: rank r lies in domain
r // tier.ranks of each tier, so two ranks talk over the innermost tier whose domain holds both.
A tier's bandwidth is what ONE rank can send on it, and at the same time receive (full duplex),
in bytes per second; tiers have separate links, so a rank's scale-up and scale-out transfers run
concurrently. `aggregate_bandwidth` caps the bytes all ranks together move per second on a tier
(a shared medium, e.g. processes sharing CPU cores); None means a non-blocking switch.
"""

from __future__ import annotations

from typing import Optional, Sequence

import attrs
import torch

from ...core.checks import check_int
from ...core.errors import ContractError, format_problem

#: units of the command line's --tier: GB/s and microseconds
GB = 1e9
US = 1e-6


def _check_positive(op: str, arg: str, value: object, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and (
        value >= 0 if allow_zero else value > 0) and value != float("inf")
    if not ok:
        want = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ContractError(format_problem(op, arg, repr(value), want, f"pass {arg} as {want} (SI units)"))


@attrs.frozen
class Tier:
    """One level of the fabric.

    name: e.g. "NVLink", "UB scale-up", "RDMA scale-out"; ranks: ranks per domain of this tier
    (None: unbounded, for the outermost tier); bandwidth: bytes/s one rank sends (and receives)
    on this tier; hop_latency: seconds per switch hop; hops: hops a message crosses on this tier
    (1 through a single switch, 3 through a two-layer Clos: leaf, spine, leaf); aggregate_bandwidth:
    bytes/s all ranks together can move on this tier (None: non-blocking).
    """

    name: str
    ranks: Optional[int]
    bandwidth: float
    hop_latency: float
    hops: int = 1
    aggregate_bandwidth: Optional[float] = None

    def __attrs_post_init__(self) -> None:
        op = "Tier"
        if not isinstance(self.name, str) or not self.name:
            raise ContractError(format_problem(op, "name", repr(self.name), "a non-empty str", "name the tier"))
        if self.ranks is not None:
            check_int(op, "ranks", self.ranks, 1, fix="pass the ranks per domain as an int >= 1, or None (unbounded)")
        _check_positive(op, "bandwidth", self.bandwidth)
        _check_positive(op, "hop_latency", self.hop_latency, allow_zero=True)
        check_int(op, "hops", self.hops, 0)
        if self.aggregate_bandwidth is not None:
            _check_positive(op, "aggregate_bandwidth", self.aggregate_bandwidth)

    @property
    def latency(self) -> float:
        """Seconds a message spends crossing this tier: hops x hop latency."""
        return self.hops * self.hop_latency

    def describe(self) -> str:
        domain = "unbounded" if self.ranks is None else f"{self.ranks} ranks"
        text = (f"{self.name}: {domain} per domain, {self.bandwidth / GB:g} GB/s per rank per direction, "
                f"{self.hops} hop(s) x {self.hop_latency / US:g} us")
        if self.aggregate_bandwidth is not None:
            text += f", all ranks together at most {self.aggregate_bandwidth / GB:g} GB/s"
        return text


@attrs.frozen
class Fabric:
    """Tiers from innermost to outermost, plus per-message and local-copy costs.

    message_overhead: seconds of a rank's own time per message it sends in a phase (0 for
    fabrics whose messages are issued in parallel by hardware; a CPU transport pays it serially);
    local_bandwidth: bytes/s of a rank's copy of its own rows (None: free — they never leave the
    device). sources: where each figure comes from (shown by the CLI and the docs).
    """

    name: str
    tiers: tuple[Tier, ...]
    message_overhead: float = 0.0
    local_bandwidth: Optional[float] = None
    description: str = ""
    sources: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        op = "Fabric"
        if not isinstance(self.tiers, tuple) or not self.tiers or not all(isinstance(t, Tier) for t in self.tiers):
            raise ContractError(format_problem(op, "tiers", repr(self.tiers), "a non-empty tuple of Tier",
                                               "list the tiers from the innermost to the outermost"))
        for i, (inner, outer) in enumerate(zip(self.tiers, self.tiers[1:])):
            if inner.ranks is None:
                raise ContractError(format_problem(op, f"tiers[{i}].ranks", None,
                                                   "a size (only the outermost tier may be unbounded)",
                                                   "give every inner tier its domain size"))
            if outer.ranks is not None and (outer.ranks <= inner.ranks or outer.ranks % inner.ranks):
                raise ContractError(format_problem(
                    op, f"tiers[{i + 1}].ranks", outer.ranks,
                    f"a multiple of the inner tier's {inner.ranks} ranks, larger than it",
                    "nest the domains: each outer domain holds whole inner domains"))
        _check_positive(op, "message_overhead", self.message_overhead, allow_zero=True)
        if self.local_bandwidth is not None:
            _check_positive(op, "local_bandwidth", self.local_bandwidth)

    @property
    def max_ranks(self) -> Optional[int]:
        """The most ranks the fabric holds (None: unbounded)."""
        return self.tiers[-1].ranks

    def check_ranks(self, num_ranks: int) -> None:
        check_int("Fabric", "num_ranks", num_ranks, 1, fix="pass the EP degree as an int >= 1")
        if self.max_ranks is not None and num_ranks > self.max_ranks:
            raise ContractError(format_problem(
                f"fabric '{self.name}'", "num_ranks (EP degree)", num_ranks, f"<= {self.max_ranks}",
                f"this fabric holds {self.max_ranks} ranks; pick a smaller EP degree or a fabric with another tier"))

    def tier_matrix(self, num_ranks: int) -> torch.Tensor:
        """int64 [R, R]: the tier index carrying traffic from rank s to rank d; -1 on the diagonal
        (a rank's rows to itself never leave it)."""
        self.check_ranks(num_ranks)
        ranks = torch.arange(num_ranks)
        tier = torch.full((num_ranks, num_ranks), len(self.tiers) - 1, dtype=torch.int64)
        # walk from the outermost tier inwards so the innermost shared domain wins
        for i in range(len(self.tiers) - 1, -1, -1):
            size = self.tiers[i].ranks
            if size is None:
                continue
            domain = ranks // size
            tier[domain[:, None] == domain[None, :]] = i
        tier.fill_diagonal_(-1)
        return tier

    def describe(self) -> str:
        lines = [f"{self.name}: {self.description}" if self.description else self.name]
        lines += [f"  tier {i}: {t.describe()}" for i, t in enumerate(self.tiers)]
        if self.message_overhead:
            lines.append(f"  {self.message_overhead / US:g} us of the rank's own time per message")
        lines.append("  rows to self: " + ("free (never leave the device)" if self.local_bandwidth is None
                                          else f"copied at {self.local_bandwidth / GB:g} GB/s"))
        return "\n".join(lines)


def parse_tier(spec: str) -> Tier:
    """'NAME:RANKS:GBPS:LATENCY_US[:HOPS]' -> Tier; RANKS may be '*' (unbounded), e.g.
    'NVLink:8:160:1' or 'RDMA:*:50:2:3'."""
    op = "--tier"
    parts = spec.split(":")
    if len(parts) not in (4, 5) or not parts[0]:
        raise ContractError(format_problem(op, "spec", repr(spec), "NAME:RANKS:GBPS:LATENCY_US[:HOPS]",
                                           "e.g. --tier NVLink:8:160:1 --tier RDMA:*:50:2:3"))
    try:
        ranks = None if parts[1] == "*" else int(parts[1])
        bandwidth = float(parts[2]) * GB
        latency = float(parts[3]) * US
        hops = int(parts[4]) if len(parts) == 5 else 1
    except ValueError as exc:
        raise ContractError(format_problem(op, "spec", repr(spec), "NAME:RANKS:GBPS:LATENCY_US[:HOPS] with numbers",
                                           "RANKS and HOPS are ints (RANKS may be *), GBPS and LATENCY_US numbers")
                            ) from exc
    return Tier(parts[0], ranks, bandwidth, latency, hops)


def custom_fabric(tiers: Sequence[Tier], name: str = "custom") -> Fabric:
    return Fabric(name, tuple(tiers), description="given on the command line")
