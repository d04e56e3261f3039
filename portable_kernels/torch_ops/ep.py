"""Custom op of the expert-parallel routing layout: get_dispatch_layout.

It returns `(num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank)`; the route puts DeepEP's
`num_tokens_per_rdma_rank` (None in this contract) back in second place. The `simulate_*` ops are
not custom ops: they simulate R ranks in one process to state the dispatch/combine contract, and
return per-rank Python structures whose sizes are read from the routing — see docs/custom-ops.md.
Schema, route and implementation come from the public signature (`declare.custom_op`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops.ep import dispatch_layout
from .declare import custom_op


def _fake(topk_idx: torch.Tensor, num_experts: int, num_ranks: int) -> tuple:
    t = topk_idx.shape[0]
    return (topk_idx.new_empty((num_ranks,), dtype=torch.int32), topk_idx.new_empty((num_experts,), dtype=torch.int32),
            topk_idx.new_empty((t, num_ranks), dtype=torch.bool))


def _outputs(value: tuple, **_: Any) -> tuple:
    per_rank, _rdma, per_expert, in_rank = value
    return per_rank, per_expert, in_rank


def _result(outputs: tuple, **_: Any) -> tuple:
    per_rank, per_expert, in_rank = outputs
    return per_rank, None, per_expert, in_rank


custom_op(dispatch_layout.get_dispatch_layout,
          returns="(Tensor num_tokens_per_rank, Tensor num_tokens_per_expert, Tensor is_token_in_rank)",
          fake=_fake, outputs=_outputs, result=_result)
