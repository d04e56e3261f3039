"""Custom op of the expert-parallel routing layout: get_dispatch_layout.

It returns `(num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank)`; the route puts DeepEP's
`num_tokens_per_rdma_rank` (None in this contract) back in second place. The `simulate_*` ops are
not custom ops: they simulate R ranks in one process to state the dispatch/combine contract, and
return per-rank Python structures whose sizes are read from the routing — see docs/custom-ops.md.
"""

from __future__ import annotations

import torch

from ..core.compiled import ROUTES
from ..ops.ep import dispatch_layout
from .boundary import define, fresh, op


def _impl(topk_idx, num_experts, num_ranks):
    per_rank, _, per_expert, in_rank = dispatch_layout.get_dispatch_layout(topk_idx, num_experts, num_ranks)
    return fresh((per_rank, per_expert, in_rank), topk_idx)


def _fake(topk_idx, num_experts, num_ranks):
    t = topk_idx.shape[0]
    return (topk_idx.new_empty((num_ranks,), dtype=torch.int32), topk_idx.new_empty((num_experts,), dtype=torch.int32),
            topk_idx.new_empty((t, num_ranks), dtype=torch.bool))


define("get_dispatch_layout(Tensor topk_idx, int num_experts, int num_ranks) -> (Tensor num_tokens_per_rank, "
       "Tensor num_tokens_per_expert, Tensor is_token_in_rank)", _impl, _fake)


def get_dispatch_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int
                        ) -> tuple[torch.Tensor, None, torch.Tensor, torch.Tensor]:
    per_rank, per_expert, in_rank = op("get_dispatch_layout")(topk_idx, num_experts, num_ranks)
    return per_rank, None, per_expert, in_rank


ROUTES.update(get_dispatch_layout=get_dispatch_layout)
