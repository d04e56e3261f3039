"""Routing statistics of the cost model, from the same layout `get_dispatch_layout` produces.

`RoutingSpec` draws each rank's top-k expert ids (seeded): uniform, skewed (expert popularity
falls off as a Zipf law of exponent `skew` over a seeded permutation of the experts) and
optionally group-limited (each token first picks `topk_groups` of `groups` expert groups, as
DeepSeek-V3's gate does, then its experts inside them). Sampling is without replacement in
proportion to popularity (Gumbel top-k), so `skew=0` is plain uniform top-k.

`row_counts(topk_idx per rank, num_experts)` runs the public `get_dispatch_layout` op on every
rank's ids and keeps what the exchange needs: rows[s][d], the tokens of rank s that reach rank d
(each token once per rank holding any of its experts — exactly the rows the Buffer sends), and
the tokens per expert. Given ids (a real router's, a benchmark's) go through the same function.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import attrs
import torch

from ...core.checks import check_int
from ...core.errors import ContractError, format_problem
from ...core.tensors import describe
from ...ops.ep.dispatch_layout import get_dispatch_layout
from .shape import MoEShape

#: the layout op runs on several ranks' ids at once, up to this many [token, rank] flags per call
LAYOUT_CHUNK_ELEMENTS = 1 << 25
#: a rank's generator seed is seed * this + rank, so ranks draw independent routings
RANK_SEED_STRIDE = 1_000_003


@attrs.frozen
class RoutingSpec:
    """How tokens pick experts. seed: the draw; skew: Zipf exponent of expert popularity (0 =
    uniform; 1 means the k-th most popular expert is picked about 1/k as often as the first);
    groups / topk_groups: group-limited routing (E/groups consecutive experts per group)."""

    seed: int = 0
    skew: float = 0.0
    groups: Optional[int] = None
    topk_groups: Optional[int] = None

    def __attrs_post_init__(self) -> None:
        op = "RoutingSpec"
        check_int(op, "seed", self.seed, 0)
        if isinstance(self.skew, bool) or not isinstance(self.skew, (int, float)) or not (0 <= self.skew < math.inf):
            raise ContractError(format_problem(op, "skew", repr(self.skew), "a finite number >= 0",
                                               "pass skew=0 for uniform routing, e.g. 1.0 for a Zipf-like load"))
        if (self.groups is None) != (self.topk_groups is None):
            raise ContractError(format_problem(op, "groups / topk_groups", f"{self.groups} / {self.topk_groups}",
                                               "both set or both None", "pass e.g. groups=8, topk_groups=4"))
        if self.groups is not None:
            check_int(op, "groups", self.groups, 1)
            check_int(op, "topk_groups", self.topk_groups, 1, self.groups)

    def check(self, shape: MoEShape) -> None:
        if self.groups is None:
            return
        op = "RoutingSpec"
        if shape.num_experts % self.groups:
            raise ContractError(format_problem(op, "groups", self.groups, f"a divisor of num_experts "
                                               f"({shape.num_experts})", "split the experts into equal groups"))
        reachable = self.topk_groups * (shape.num_experts // self.groups)
        if shape.num_topk > reachable:
            raise ContractError(format_problem(op, "topk_groups", self.topk_groups,
                                               f"enough groups to hold top-{shape.num_topk} (they hold {reachable})",
                                               "raise topk_groups or lower num_topk"))

    def describe(self) -> str:
        text = "uniform" if self.skew == 0 else f"Zipf skew {self.skew:g}"
        if self.groups is not None:
            text += f", top-{self.topk_groups} of {self.groups} expert groups"
        return f"{text}, seed {self.seed}"

    def expert_log_popularity(self, num_experts: int) -> torch.Tensor:
        """fp32 [E]: log of each expert's (unnormalised) popularity; the same on every rank."""
        if self.skew == 0:
            return torch.zeros(num_experts)
        order = torch.randperm(num_experts, generator=torch.Generator().manual_seed(self.seed))
        return -self.skew * torch.log1p(order.float())

    def topk_idx(self, shape: MoEShape, num_ranks: int) -> list[torch.Tensor]:
        """int64 [T, k] expert ids per rank (distinct per token, none negative)."""
        self.check(shape)
        check_int("RoutingSpec.topk_idx", "num_ranks", num_ranks, 1)
        log_p = self.expert_log_popularity(shape.num_experts)
        out = []
        for rank in range(num_ranks):
            gen = torch.Generator().manual_seed(self.seed * RANK_SEED_STRIDE + rank)
            if self.skew == 0 and self.groups is None:
                # equal popularity: the top-k of iid uniform keys (DeepEP's test routing) is the same draw
                out.append(torch.rand(shape.tokens_per_rank, shape.num_experts, generator=gen)
                           .topk(shape.num_topk, dim=1).indices)
                continue
            keys = log_p + _gumbel((shape.tokens_per_rank, shape.num_experts), gen)
            if self.groups is not None:
                per_group = shape.num_experts // self.groups
                group_log_p = torch.logsumexp(log_p.view(self.groups, per_group), dim=1)
                group_keys = group_log_p + _gumbel((shape.tokens_per_rank, self.groups), gen)
                chosen = group_keys.topk(self.topk_groups, dim=1).indices
                allowed = torch.zeros(shape.tokens_per_rank, self.groups, dtype=torch.bool)
                allowed.scatter_(1, chosen, True)
                keys = keys.masked_fill(~allowed.repeat_interleave(per_group, dim=1), -math.inf)
            out.append(keys.topk(shape.num_topk, dim=1).indices)
        return out


def _gumbel(size: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    u = torch.rand(size, generator=gen).clamp_(min=1e-30)
    return -torch.log(-torch.log(u))


@attrs.frozen(eq=False)
class RowCounts:
    """rows int64 [R, R]: tokens of rank s reaching rank d (the diagonal: its own);
    tokens int64 [R]: tokens each rank dispatches; expert_tokens int64 [E]: tokens per expert."""

    rows: torch.Tensor
    tokens: torch.Tensor
    expert_tokens: torch.Tensor

    @property
    def num_ranks(self) -> int:
        return self.rows.shape[0]

    @property
    def ranks_per_token(self) -> float:
        """Mean number of distinct ranks a token reaches."""
        return float(self.rows.sum()) / max(int(self.tokens.sum()), 1)

    @property
    def expert_imbalance(self) -> float:
        """The busiest expert's tokens over the mean (1.0 = perfectly balanced)."""
        mean = float(self.expert_tokens.double().mean())
        return float(self.expert_tokens.max()) / mean if mean else 1.0

    @property
    def recv_imbalance(self) -> float:
        """The busiest rank's received rows over the mean."""
        recv = self.rows.sum(dim=0).double()
        mean = float(recv.mean())
        return float(recv.max()) / mean if mean else 1.0


def row_counts(topk_idx: Sequence[torch.Tensor], num_experts: int) -> RowCounts:
    """Run get_dispatch_layout on every rank's ids (rank r's entry = the ids it dispatches) and
    collect rows[s][d] = num_tokens_per_rank of rank s, and the tokens per expert."""
    op = "ep_cost.row_counts"
    check_int(op, "num_experts", num_experts, 1)
    if not isinstance(topk_idx, (list, tuple)) or not topk_idx:
        raise ContractError(format_problem(op, "topk_idx", describe(topk_idx), "a non-empty list, one [T, k] "
                                           "tensor per rank", "pass [ids of rank 0, ids of rank 1, ...]"))
    num_ranks = len(topk_idx)
    for r, ids in enumerate(topk_idx):
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise ContractError(format_problem(op, f"topk_idx[{r}]", describe(ids), "an int [T, k] tensor",
                                               "pass each rank's router output, int64 [tokens, top-k]"))
    rows = torch.zeros(num_ranks, num_ranks, dtype=torch.int64)
    expert_tokens = torch.zeros(num_experts, dtype=torch.int64)
    tokens = torch.tensor([ids.shape[0] for ids in topk_idx], dtype=torch.int64)
    for start, stop in _chunks(topk_idx, num_ranks):
        ids = topk_idx[start] if stop - start == 1 else torch.cat(list(topk_idx[start:stop]))
        per_rank, _, per_expert, in_rank = get_dispatch_layout(ids.cpu(), num_experts, num_ranks)
        if stop - start == 1:
            rows[start] = per_rank.long()
        else:
            rows[start:stop] = in_rank.view(stop - start, -1, num_ranks).sum(dim=1)
        expert_tokens += per_expert.long()
    return RowCounts(rows, tokens, expert_tokens)


def _chunks(topk_idx: Sequence[torch.Tensor], num_ranks: int) -> list[tuple[int, int]]:
    """Consecutive ranks whose ids go through the layout op together: equal token counts, at most
    LAYOUT_CHUNK_ELEMENTS [token, rank] flags per call."""
    out, start = [], 0
    while start < num_ranks:
        tokens = topk_idx[start].shape[0]
        stop = start + 1
        while (stop < num_ranks and topk_idx[stop].shape == topk_idx[start].shape
               and (stop + 1 - start) * max(tokens, 1) * num_ranks <= LAYOUT_CHUNK_ELEMENTS):
            stop += 1
        out.append((start, stop))
        start = stop
    return out
