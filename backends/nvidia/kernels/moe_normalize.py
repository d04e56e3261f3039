"""normalize_weight (TileKernels' name) in Triton: each token's top-k weights divided by their sum.

The contract fixes the bytes: the fp32 denominator starts at 1e-20 and adds the slots one by one
in slot order (one rounding per addition), and the division is IEEE round-to-nearest
(`div_rn`; Triton's plain `/` on the GPU is the approximate `div.full.f32`). So the result is the
reference's bit for bit. A program covers BLOCK_T tokens x all k slots; NaN/Inf propagate into
their token's row, as the contract says.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import serialized

OP = "normalize_weight"
#: tokens per program
BLOCK_T = 64
#: added to the weight sum first (the contract's NORMALIZE_EPS, as fp32)
EPS = 1e-20


@triton.jit
def moe_normalize_kernel(w_ptr, den_ptr, out_ptr, T, K, stride_t, stride_k, stride_o, EPS: tl.constexpr,
                         BLOCK_T: tl.constexpr, K_POW2: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tokens < T
    rows = tokens.to(tl.int64)
    den = tl.full((BLOCK_T,), EPS, tl.float32)
    for j in range(K):  # slot order: one fp32 rounding per addition, as the contract's reference
        den = den + tl.load(w_ptr + rows * stride_t + j * stride_k, mask=tmask, other=0.0)
    slots = tl.arange(0, K_POW2)
    m = tmask[:, None] & (slots[None, :] < K)
    w = tl.load(w_ptr + rows[:, None] * stride_t + slots[None, :] * stride_k, mask=m, other=1.0)
    tl.store(out_ptr + rows[:, None] * stride_o + slots[None, :], tl.math.div_rn(w, den[:, None]), mask=m)
    tl.store(den_ptr + rows, den, mask=tmask)


@serialized
def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_weights fp32 [T, k] (any strides) -> (denominator fp32 [T], normalized fp32 [T, k] contiguous)."""
    _checks.tensor(OP, "topk_weights", topk_weights, (torch.float32,), (None, None))
    t, k = topk_weights.shape
    den = torch.empty(t, dtype=torch.float32, device=topk_weights.device)
    out = torch.empty(t, k, dtype=torch.float32, device=topk_weights.device)
    if t == 0:
        return den, out
    moe_normalize_kernel[(triton.cdiv(t, BLOCK_T),)](
        topk_weights, den, out, t, k, topk_weights.stride(0), topk_weights.stride(1), max(k, 1), EPS=EPS,
        BLOCK_T=BLOCK_T, K_POW2=triton.next_power_of_2(max(k, 1)))
    return den, out
