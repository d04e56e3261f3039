"""get_dispatch_layout (DeepEP's `Buffer.get_dispatch_layout`) in Triton: which ranks each token
goes to, and how many tokens each rank and each expert receives.

A program takes BLOCK_T tokens: for each block of R_BLOCK ranks it marks is_token_in_rank (a
token goes to rank r when one of its slots names an expert of r, experts [r·E/R, (r+1)·E/R)),
adds the block's per-rank token counts to num_tokens_per_rank, and adds one per valid slot to
num_tokens_per_expert. The counts are integer atomic adds into zeroed outputs: any order gives
the same integers, so the results equal the reference's exactly. Ids outside [0, E) (negative =
"no expert") count nowhere and mark no rank, so unchecked device ids stay in bounds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import serialized

OP = "get_dispatch_layout"
#: tokens per program, ranks per tile
BLOCK_T = 32
R_BLOCK = 32


@triton.jit
def ep_layout_kernel(idx_ptr, per_rank_ptr, per_expert_ptr, in_rank_ptr, T, K, E, R, PER_RANK,
                     BLOCK_T: tl.constexpr, K_POW2: tl.constexpr, R_BLOCK: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tokens < T
    rows = tokens.to(tl.int64)
    slots = tl.arange(0, K_POW2)
    smask = tmask[:, None] & (slots[None, :] < K)
    v = tl.load(idx_ptr + rows[:, None] * K + slots[None, :], mask=smask, other=-1)
    valid = smask & (v >= 0) & (v < E)
    expert = tl.where(valid, v, 0).to(tl.int32)
    tl.atomic_add(per_expert_ptr + expert, tl.full((BLOCK_T, K_POW2), 1, tl.int32), mask=valid, sem="relaxed")
    dest = tl.where(valid, expert // PER_RANK, -1)
    for r0 in range(0, R, R_BLOCK):
        ranks = r0 + tl.arange(0, R_BLOCK)
        hit = tl.zeros((BLOCK_T, R_BLOCK), tl.int32)
        for j in tl.static_range(K_POW2):
            dest_j = tl.sum(tl.where(slots[None, :] == j, dest, 0), axis=1)  # -1 where slot j is padding
            hit = tl.maximum(hit, (dest_j[:, None] == ranks[None, :]).to(tl.int32))
        rmask = ranks < R
        tl.store(in_rank_ptr + rows[:, None] * R + ranks[None, :], hit.to(tl.uint8),
                 mask=tmask[:, None] & rmask[None, :])
        tl.atomic_add(per_rank_ptr + ranks, tl.sum(hit, axis=0), mask=rmask, sem="relaxed")


@serialized
def get_dispatch_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int
                        ) -> tuple[torch.Tensor, None, torch.Tensor, torch.Tensor]:
    """topk_idx int32/int64 [T, k] -> (num_tokens_per_rank int32 [R], None, num_tokens_per_expert
    int32 [E], is_token_in_rank bool [T, R]); E a multiple of R."""
    _checks.tensor(OP, "topk_idx", topk_idx, (torch.int32, torch.int64), (None, None))
    for arg, value in (("num_experts", num_experts), ("num_ranks", num_ranks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            _checks.fail(OP, arg, repr(value), "an int >= 1", "pass the validated call's value")
    if num_experts % num_ranks:
        _checks.fail(OP, "num_experts", num_experts, f"a multiple of num_ranks = {num_ranks}",
                     "give every rank the same number of experts")
    idx = topk_idx.contiguous()
    t, k = idx.shape
    device = idx.device
    per_rank = torch.zeros(num_ranks, dtype=torch.int32, device=device)
    per_expert = torch.zeros(num_experts, dtype=torch.int32, device=device)
    in_rank = torch.empty(t, num_ranks, dtype=torch.bool, device=device)
    if t == 0:
        return per_rank, None, per_expert, in_rank
    if k == 0:
        in_rank.zero_()
        return per_rank, None, per_expert, in_rank
    ep_layout_kernel[(triton.cdiv(t, BLOCK_T),)](
        idx, per_rank, per_expert, in_rank.view(torch.uint8), t, k, num_experts, num_ranks,
        num_experts // num_ranks, BLOCK_T=BLOCK_T, K_POW2=triton.next_power_of_2(k),
        R_BLOCK=min(R_BLOCK, triton.next_power_of_2(num_ranks)))
    return per_rank, None, per_expert, in_rank
