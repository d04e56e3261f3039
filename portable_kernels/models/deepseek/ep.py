"""Expert parallelism for the model: each rank of a torch.distributed group holds 1/N of every MoE
layer's routed experts; tokens go to the ranks of their experts by `ep.Buffer.dispatch` and come
back weighted and summed by `Buffer.combine` (DeepEP's normal mode, as DeepSeek's inference uses it).

Prefill steps use the normal pair; decode steps of at most LOW_LATENCY_MAX_TOKENS sequences use
the low-latency pair (`Buffer.low_latency_dispatch` with FP8 rows prepared for
`m_grouped_fp8_gemm_nt_masked`, the masked GEMMs, `Buffer.low_latency_combine`), as serving
engines run DeepEP; larger decode batches fall back to the normal pair.

One rule, and what it leaves out: attention, the dense layers, the router and the shared experts
run replicated on every rank over the whole batch (no data-parallel attention), so every rank
computes the same tokens and needs no gather; only the routed experts' weights and compute are
divided. Gloo on CPU here; NCCL/HCCL where the group has them.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import torch

from ...core.errors import EPTimeoutError
from ...ops import ep as pk_ep
from .errors import UnsupportedConfigError
from .layers import MASKED_MAX_TOKENS

#: the op the low-latency dispatch prepares its FP8 rows for (Moe.masked_experts' GEMM)
MASKED_GEMM = "m_grouped_fp8_gemm_nt_masked"
#: the normal-mode staging budget per rank (bytes one dispatch/combine may move)
DEFAULT_EP_BYTES = 1 << 28
#: store key prefix of each rank's progress (MoE calls begun), read to name a rank that stopped
PROGRESS_KEY = "pk_ep_moe_calls"
#: the largest decode batch the low-latency pair carries (its num_max_dispatch_tokens_per_rank bound)
LOW_LATENCY_MAX_TOKENS = MASKED_MAX_TOKENS


@attrs.define
class ExpertParallel:
    """The group, this rank's slice of the experts, and the Buffer that moves the tokens."""

    group: Any
    rank: int
    num_ranks: int
    num_experts: int
    buffer: Any
    store: Any = None   # the group's torch.distributed store (progress keys), None if unavailable
    calls: int = 0
    low_latency_calls: int = 0  # of `calls`: the decode steps that took the low-latency pair

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.num_ranks

    @property
    def local_experts(self) -> slice:
        return slice(self.rank * self.num_local_experts, (self.rank + 1) * self.num_local_experts)

    @staticmethod
    def create(group: Any, num_experts: int, hidden: int, num_bytes: int = DEFAULT_EP_BYTES) -> "ExpertParallel":
        """The group's share of `num_experts` experts and a Buffer with both budgets: `num_bytes` for the
        normal pair, the low-latency hint for LOW_LATENCY_MAX_TOKENS tokens of `hidden` channels."""
        import torch.distributed as dist

        rank, size = dist.get_rank(group), dist.get_world_size(group)
        if num_experts % size:
            raise UnsupportedConfigError(f"n_routed_experts = {num_experts} does not split over {size} ranks. Fix: "
                                         "use an expert-parallel size that divides the expert count")
        try:
            store = dist.distributed_c10d._get_default_store()
        except Exception:  # no default group's store (a custom transport): faults name no rank
            store = None
        low_latency_bytes = pk_ep.Buffer.get_low_latency_rdma_size_hint(LOW_LATENCY_MAX_TOKENS, hidden, size,
                                                                        num_experts)
        buffer = pk_ep.Buffer(group, num_bytes, low_latency_bytes, low_latency_mode=True)
        ep = ExpertParallel(group, rank, size, num_experts, buffer, store)
        ep._publish()
        return ep

    def _key(self, rank: int) -> str:
        return f"{PROGRESS_KEY}/{rank}"

    def _publish(self) -> None:
        if self.store is not None:
            self.store.set(self._key(self.rank), str(self.calls))

    def _laggards(self) -> str:
        """Which ranks never began this MoE call (read from the store after a timeout)."""
        if self.store is None:
            return "the ranks' progress is not recorded (no torch.distributed store)"
        behind = []
        try:
            for r in range(self.num_ranks):
                if r != self.rank and self.store.check([self._key(r)]):
                    done = int(self.store.get(self._key(r)))
                    if done < self.calls:
                        behind.append(f"rank {r} (stopped after MoE call {done})")
        except Exception as exc:  # the store lives on rank 0's process, which may be the one that died
            return (f"the progress store cannot be read ({type(exc).__name__}: {exc}): it lives in rank 0's process, "
                    "which died or has already exited")
        return ("; ".join(behind) + " never began it") if behind else "every rank began it (a stall inside the call)"

    def moe(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
            experts: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
            masked_experts: Callable[[Any, torch.Tensor, int], torch.Tensor] | None = None) -> torch.Tensor:
        """sum_k w_k · expert_k(x) for every token, the experts computed on the ranks that hold them:
        `experts(rows, local_topk_idx, weights, num_local_experts)` runs this rank's share. fp32 [T, H].
        With `masked_experts(rows, counts, expected_m)` (a decode step) and at most
        LOW_LATENCY_MAX_TOKENS tokens, the low-latency pair carries the rows instead. Every rank
        holds the same x (replicated attention), so every rank takes the same branch."""
        self.calls += 1
        self._publish()
        try:
            if masked_experts is not None and x.shape[0] <= LOW_LATENCY_MAX_TOKENS:
                self.low_latency_calls += 1
                return self._low_latency(x, topk_idx, topk_weights, masked_experts)
            per_rank, _, per_expert, in_rank, _ = self.buffer.get_dispatch_layout(topk_idx, self.num_experts)
            recv_x, recv_idx, recv_w, _, handle, _ = self.buffer.dispatch(
                x.bfloat16().contiguous(), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_weights)
            if recv_x.shape[0]:
                local = experts(recv_x, recv_idx, recv_w, self.num_local_experts).bfloat16()
            else:
                local = recv_x.new_zeros(0, x.shape[1])
            combined, _, _ = self.buffer.combine(local, handle)
        except EPTimeoutError as exc:
            raise EPTimeoutError(f"expert-parallel MoE call {self.calls} on rank {self.rank} of {self.num_ranks}: "
                                 f"{self._laggards()}. {exc}") from exc
        return combined.float()

    def _low_latency(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                     masked_experts: Callable[[Any, torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
        """Low-latency dispatch (FP8 rows, power-of-two scales as the model's activations, prepared for
        the masked GEMM) -> this rank's experts -> weighted low-latency combine. fp32 [T, H]."""
        tokens = x.shape[0]
        rows, counts, handle, _, _ = self.buffer.low_latency_dispatch(
            x.bfloat16().contiguous(), topk_idx, max(tokens, 1), self.num_experts, use_fp8=True, round_scale=True,
            prepare_for=MASKED_GEMM)
        # the masked GEMM's host hint: the mean rows an expert receives (every rank sends its tokens)
        expected = max(1, -(-tokens * self.num_ranks * topk_idx.shape[1] // self.num_experts))
        out = masked_experts(rows, counts, expected)
        combined, _, _ = self.buffer.low_latency_combine(out, topk_idx, topk_weights, handle)
        return combined.float()
