"""`get_dispatch_layout`, where one rank's tokens go (DeepEP's `Buffer.get_dispatch_layout`): its
reference, its contract and the public op."""

from __future__ import annotations

import attrs
import torch

from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ...core.providers import Inputs
from .checks import _check_num_experts, _check_positive_int, _check_topk_idx


def dispatch_layout_reference(topk_idx: torch.Tensor, num_experts: int, num_ranks: int
                              ) -> tuple[torch.Tensor, None, torch.Tensor, torch.Tensor]:
    """topk_idx [T, k] -> (num_tokens_per_rank int32 [R], None, num_tokens_per_expert int32 [E],
    is_token_in_rank bool [T, R])."""
    idx = topk_idx.long()
    valid = idx >= 0
    # a spare column R collects the "no expert" entries so one scatter covers every entry
    dest = torch.where(valid, idx // (num_experts // num_ranks), num_ranks)
    in_rank = torch.zeros(idx.shape[0], num_ranks + 1, dtype=torch.bool, device=idx.device)
    in_rank.scatter_(1, dest, True)
    is_token_in_rank = in_rank[:, :num_ranks].contiguous()
    num_tokens_per_rank = is_token_in_rank.sum(dim=0, dtype=torch.int32)
    num_tokens_per_expert = torch.bincount(idx[valid], minlength=num_experts).to(torch.int32)
    return num_tokens_per_rank, None, num_tokens_per_expert, is_token_in_rank


@attrs.frozen
class DispatchLayoutInputs(Inputs):
    """One get_dispatch_layout call: topk_idx [T, k], E experts over R ranks."""

    topk_idx: torch.Tensor
    num_experts: int
    num_ranks: int
    device_field = "topk_idx"

    def dims(self) -> dict[str, int]:
        return {"T": self.topk_idx.shape[0], "k": self.topk_idx.shape[1], "E": self.num_experts, "R": self.num_ranks}


def dispatch_layout_kernel(call: DispatchLayoutInputs) -> tuple[torch.Tensor, None, torch.Tensor, torch.Tensor]:
    """Reference kernel of get_dispatch_layout."""
    return dispatch_layout_reference(call.topk_idx, call.num_experts, call.num_ranks)


GET_DISPATCH_LAYOUT = register_contract(OpContract(
    "get_dispatch_layout", dispatch_layout_reference, Tolerance(dequantized=0.0), kernel=dispatch_layout_kernel))


@public_op(GET_DISPATCH_LAYOUT)
def get_dispatch_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int
                        ) -> tuple[torch.Tensor, None, torch.Tensor, torch.Tensor]:
    """Where one rank's tokens go: DeepEP's `Buffer.get_dispatch_layout(topk_idx, num_experts)`.

    topk_idx: int64 (or int32) [T, k], expert ids < num_experts, negative = no expert
    num_experts: E, a multiple of num_ranks (rank r owns experts [r*E/R, (r+1)*E/R))
    num_ranks: R, the EP group size (DeepEP takes it from its Buffer's group)
    Returns (num_tokens_per_rank int32 [R], num_tokens_per_rdma_rank None, num_tokens_per_expert
    int32 [E], is_token_in_rank bool [T, R]) — DeepEP's tuple without the trailing event; the RDMA
    split is None as in DeepEP's intranode setting (a deployment detail, not part of the contract).
    """
    if is_compiling():
        return compiled_call("get_dispatch_layout", topk_idx, num_experts, num_ranks)
    op = GET_DISPATCH_LAYOUT.name
    _check_positive_int(op, "num_ranks", num_ranks)
    _check_num_experts(op, num_experts, num_ranks)
    _check_topk_idx(op, "topk_idx", topk_idx, num_experts, None, None, None)
    return run(GET_DISPATCH_LAYOUT, DispatchLayoutInputs(topk_idx, num_experts, num_ranks))
