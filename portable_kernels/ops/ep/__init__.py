"""Expert-parallel dispatch / combine (DeepEP names): the contract, as a single-process reference.

DeepEP moves MoE tokens between R ranks that each own E/R consecutive experts. This module states
what every rank must receive and return, by simulating all R ranks in one process: each
`simulate_*` function takes one entry per rank (rank r's own inputs, as it would pass them to
DeepEP's `Buffer`) and returns one result per rank (what DeepEP returns on rank r), so a real
distributed implementation can be checked rank by rank against it.

- `get_dispatch_layout(topk_idx, num_experts, num_ranks)`: DeepEP's `Buffer.get_dispatch_layout`
  as a module-level op (the group size is an argument instead of the buffer's, no event).
- normal mode, `simulate_dispatch` / `simulate_combine`: each token reaches each destination rank
  at most once; rows ordered by source rank, then source token; topk_idx remapped to local expert
  ids (-1 elsewhere, weight 0 there); per-expert counts aligned up to `expert_alignment`; combine
  sums the returned rows of each source token WITHOUT weights, in fp32.
- low-latency mode, `simulate_low_latency_dispatch` / `simulate_low_latency_combine`: per-expert
  packed rows [num_local_experts, num_max_dispatch_tokens_per_rank * R, hidden], one copy per
  (token, expert); combine returns the WEIGHTED sum. Row order inside an expert is unspecified
  (`LowLatencyDispatchResult.sorted_by_source` gives the canonical order to compare in).

The distributed `Buffer` (DeepEP's class: same constructor, methods, arguments and return
tuples) runs the same contract across the ranks of a torch.distributed group (Gloo, NCCL, HCCL);
`from portable_kernels.ops.ep import Buffer, EventOverlap, Config` replaces `from deep_ep import ...`.

Rule: negative topk_idx entries mean "no expert"; the non-negative experts of one token are
distinct (a duplicate is refused: DeepEP would move the token twice, torch_npu refuses it).

Modules: `constants`, `results` (the per-rank result and handle types), `checks` (argument
validation), `ranks` (the concatenated-ranks helper of the references), `dispatch_layout`,
`normal` and `low_latency` (reference, contract and public op of each mode); for the Buffer:
`buffer`, `buffer_checks`, `agreement`, `wire`, `transport`, `normal_exchange`,
`low_latency_exchange`, `events`, `sizes`. This package re-exports every name of the former
single module.
"""

import torch as _torch

# imported in this order so the contracts register in the order the ops are documented
from .constants import (COMBINE_BOUND, FP8_DISPATCH_BOUND, LAYOUT_RANGE_COUNT_MASK, LAYOUT_RANGE_SHIFT, NO_EXPERT,
                        SCALE_BLOCK, TOPK_IDX_DTYPES, WEIGHT_DTYPE, X_DTYPES)
from .results import (CombineResult, DispatchHandle, DispatchResult, LowLatencyDispatchResult, LowLatencyHandle,
                      Rows)
from .dispatch_layout import GET_DISPATCH_LAYOUT, dispatch_layout_reference, get_dispatch_layout
from .normal import (SIMULATE_COMBINE, SIMULATE_DISPATCH, combine_reference, dispatch_reference, simulate_combine,
                     simulate_dispatch)
from .events import EventHandle, EventOverlap
from .sizes import Config, get_low_latency_rdma_size_hint
from .transport import Transport, TorchDistributedTransport
from .low_latency_exchange import AllToAllLowLatencyEngine, LowLatencyEngine
from .buffer import Buffer
from ...core.errors import EPTimeoutError
from .low_latency import (SIMULATE_LOW_LATENCY_COMBINE, SIMULATE_LOW_LATENCY_DISPATCH, low_latency_combine_reference,
                          low_latency_dispatch_reference, simulate_low_latency_combine, simulate_low_latency_dispatch)

#: DeepEP's `topk_idx_t`: the dtype of expert ids
topk_idx_t = _torch.int64

__all__ = [
    "Buffer", "Config", "EPTimeoutError", "EventHandle", "EventOverlap", "get_low_latency_rdma_size_hint",
    "topk_idx_t", "Transport", "TorchDistributedTransport", "LowLatencyEngine", "AllToAllLowLatencyEngine",
    "CombineResult", "DispatchHandle", "DispatchResult", "LowLatencyDispatchResult", "LowLatencyHandle",
    "get_dispatch_layout", "simulate_combine", "simulate_dispatch", "simulate_low_latency_combine",
    "simulate_low_latency_dispatch",
    # contracts, references and constants, for backends and the conformance cases
    "GET_DISPATCH_LAYOUT", "SIMULATE_COMBINE", "SIMULATE_DISPATCH", "SIMULATE_LOW_LATENCY_COMBINE",
    "SIMULATE_LOW_LATENCY_DISPATCH", "combine_reference", "dispatch_layout_reference", "dispatch_reference",
    "low_latency_combine_reference", "low_latency_dispatch_reference",
    "COMBINE_BOUND", "FP8_DISPATCH_BOUND", "LAYOUT_RANGE_COUNT_MASK", "LAYOUT_RANGE_SHIFT", "NO_EXPERT", "Rows",
    "SCALE_BLOCK", "TOPK_IDX_DTYPES", "WEIGHT_DTYPE", "X_DTYPES",
]
