"""The ground truth of the EP cost model: the bytes the distributed Buffer really hands to its
collectives, per call and per destination rank.

`CountingTransport` is the Buffer's own torch.distributed transport that records, for every
all-to-all it starts (the header exchange included: it runs as one), the op, what it moves and
the bytes it sends to each rank. `count_buffer_bytes` is a `run_ranks` target: one Buffer, one
dispatch (bf16 or FP8, with ids and weights) and one combine of the received rows; it returns the
rank's routing and the recorded sends, so a test can compare them with
`portable_kernels.tools.ep_cost.call_traffic` computed from the same routing.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from ..ops.ep import Buffer, TorchDistributedTransport
from ..ops.quant.fp8 import per_token_cast_to_fp8
from .ep_cases import random_routing
from .generators import randn


class CountingTransport(TorchDistributedTransport):
    """Records (op, what, bytes to each rank) for every all-to-all, then runs it unchanged."""

    def __init__(self, group: Any, timeout: float) -> None:
        super().__init__(group, timeout)
        self.sent: list[tuple[str, str, list[int]]] = []

    def start_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: Sequence[int],
                         in_splits: Sequence[int], op: str, what: str = "all-to-all") -> Any:
        width = inp.element_size() * math.prod(inp.shape[1:])
        self.sent.append((op, what, [int(s) * width for s in in_splits]))
        return super().start_all_to_all(out, inp, out_splits, in_splits, op, what)


def count_buffer_bytes(rank: int, num_ranks: int, group: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """One dispatch + combine through a CountingTransport; cfg: tokens, hidden, topk, experts, fp8, seed."""
    torch.set_num_threads(1)
    tokens, hidden = cfg["tokens"], cfg["hidden"]
    idx = random_routing(tokens, cfg["topk"], cfg["experts"], seed=cfg["seed"] + rank)
    weights = randn(tokens, cfg["topk"], seed=cfg["seed"] + 100 + rank).abs()
    x = randn(tokens, hidden, seed=cfg["seed"] + 200 + rank, dtype=torch.bfloat16)
    payload = tuple(per_token_cast_to_fp8(x)) if cfg["fp8"] else x
    transport = CountingTransport(group, 60.0)
    buffer = Buffer(group, int(1e8), transport=transport)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, cfg["experts"])
    recv = buffer.dispatch(payload, topk_idx=idx, topk_weights=weights, num_tokens_per_rank=per_rank,
                           is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    rows = (recv[0][0] if cfg["fp8"] else recv[0]).shape[0]
    buffer.combine(randn(rows, hidden, seed=cfg["seed"] + 300 + rank, dtype=torch.bfloat16), recv[4])
    return {"topk_idx": idx, "sent": transport.sent}
