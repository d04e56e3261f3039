"""Validation of dispatch handles before a combine follows them.

A combine sends each received row back to the (source rank, source token) its handle names, so a
handle that names a token out of range, the wrong token, or the same token twice would add rows
to a neighbour or drop them silently. These checks prove, from values read on the host (where
`checks_values` allows), that a handle names exactly the rows its dispatch moved:
- normal mode: rank d's handle names each (s, t) with handles[s].is_token_in_rank[t, d] once;
- low latency: each expert's layout ranges tile its valid slots, and the (source rank, token,
  expert) of the valid slots are exactly the routed pairs of the tokens' topk_idx, each once.
Rows may be reordered together with the handle's indices; the combine follows the indices.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...core.contract import checks_values
from ...core.errors import ContractError, format_problem
from .results import DispatchHandle, LowLatencyHandle

_FIX = "pass the handles the dispatch returned (rows may be reordered only together with their source indices)"


def check_layout_ranges(op: str, arg: str, handle: LowLatencyHandle) -> None:
    """Ranges in [0, M*R), disjoint per expert and covering a prefix; valid slots name tokens in [0, M)."""
    if not checks_values(handle.recv_layout_range, handle.recv_src_info):
        return
    slots = handle.recv_src_info.shape[1]
    begin, count = handle.range_begin, handle.range_count
    end = begin + count
    if bool((begin < 0).any() or (count < 0).any() or (end > slots).any()):
        raise ContractError(format_problem(op, arg, "with a recv_layout_range outside the slots",
                                           f"(begin << 32) | count ranges within [0, {slots})", _FIX))
    order = begin.argsort(dim=1)
    b, e = torch.take_along_dim(begin, order, 1), torch.take_along_dim(end, order, 1)
    nonempty = torch.take_along_dim(count, order, 1) > 0
    # sorted by begin, each non-empty range must start where the non-empty ones before it ended
    reached = torch.cat((torch.zeros_like(e[:, :1]), (e * nonempty).cummax(dim=1).values[:, :-1]), dim=1)
    if bool(((b != reached) & nonempty).any()):
        raise ContractError(format_problem(op, arg, "with overlapping or gapped layout ranges",
                                           "ranges that tile the first recv_count slots of each expert", _FIX))
    valid = torch.arange(slots, device=begin.device) < count.sum(dim=1, keepdim=True)
    info = handle.recv_src_info
    if bool(((info < 0) | (info >= handle.num_max_dispatch_tokens_per_rank))[valid].any()):
        raise ContractError(format_problem(op, arg, "with a recv_src_info entry outside [0, M) in a valid slot",
                                           "source token ids < num_max_dispatch_tokens_per_rank = "
                                           f"{handle.num_max_dispatch_tokens_per_rank}", _FIX))


def check_combine_handles(op: str, handles: Sequence[DispatchHandle]) -> None:
    """Rank d's handle names each token some rank s sent to d exactly once (any order)."""
    if not checks_values(*(h.recv_src_idx for h in handles)):
        return
    sizes = [h.num_tokens for h in handles]
    for d, h in enumerate(handles):
        src_rank, src_idx = h.recv_src_rank.long().cpu(), h.recv_src_idx.long().cpu()
        limit = torch.tensor(sizes)[src_rank]
        if bool(((src_idx < 0) | (src_idx >= limit)).any()):
            row = int(((src_idx < 0) | (src_idx >= limit)).nonzero()[0])
            raise ContractError(format_problem(op, f"handles[{d}]", f"naming token {int(src_idx[row])} of rank "
                                               f"{int(src_rank[row])} in row {row}",
                                               f"a token index in [0, {int(limit[row])}) of that rank", _FIX))
        offsets = torch.tensor([0] + sizes).cumsum(0)
        got = (offsets[src_rank] + src_idx).sort().values
        want = torch.cat([handles[s].is_token_in_rank[:, d].cpu().nonzero().flatten() + offsets[s]
                          for s in range(len(handles))])
        if not torch.equal(got, want):
            raise ContractError(format_problem(op, f"handles[{d}]", "naming tokens that were not dispatched to "
                                               f"rank {d} (or one twice)", "each token dispatched to that rank "
                                               "exactly once", _FIX))


def check_low_latency_handles(op: str, handles: Sequence[LowLatencyHandle],
                              topk_idx: Sequence[torch.Tensor]) -> None:
    """Each rank's valid slots name exactly the routed (source rank, token, expert) triples, each once."""
    for d, h in enumerate(handles):
        check_layout_ranges(op, f"handles[{d}]", h)
    if not checks_values(*(h.recv_src_info for h in handles), *topk_idx):
        return
    num_ranks = len(handles)
    sizes = [t.shape[0] for t in topk_idx]
    offsets = torch.tensor([0] + sizes).cumsum(0)
    per_rank = handles[0].num_experts // num_ranks
    seen = []
    for d, h in enumerate(handles):
        src_rank = h.recv_src_rank.long().cpu()
        expert, slot = (src_rank >= 0).nonzero(as_tuple=True)
        source, token = src_rank[expert, slot], h.recv_src_info.long().cpu()[expert, slot]
        limit = torch.tensor(sizes)[source]
        if bool((token >= limit).any()):
            i = int((token >= limit).nonzero()[0])
            raise ContractError(format_problem(op, f"handles[{d}]", f"naming token {int(token[i])} of rank "
                                               f"{int(source[i])}", f"a token index in [0, {int(limit[i])})", _FIX))
        seen.append(((offsets[source] + token) * num_ranks * per_rank + expert + d * per_rank))
    routed = []
    for s, idx in enumerate(topk_idx):
        rows, cols = (idx.cpu() >= 0).nonzero(as_tuple=True)
        routed.append((offsets[s] + rows) * num_ranks * per_rank + idx.cpu().long()[rows, cols])
    got, want = torch.cat(seen).sort().values, torch.cat(routed).sort().values
    if not torch.equal(got, want):
        raise ContractError(format_problem(op, "handles", "naming (token, expert) pairs that differ from the "
                                           "routing in topk_idx", "each routed (token, expert) pair exactly once",
                                           "pass the handles of the dispatch of this topk_idx; " + _FIX))
