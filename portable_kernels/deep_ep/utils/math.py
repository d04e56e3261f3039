"""`deep_ep.utils.math`: DeepEP's test math with its semantics (note DeepEP's calc_diff compares
x + 1 and y + 1, unlike DeepGEMM's)."""

from __future__ import annotations

from typing import Any

import torch

from ...core.harness import count_bytes

__all__ = ["align", "calc_diff", "ceil_div", "count_bytes", "create_grouped_scores", "hash_tensor", "hash_tensors",
           "inplace_unique", "per_token_cast_back", "per_token_cast_to_fp8", "safe_div"]

BLOCK = 128
FP8_MAX = 448.0


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - 2·Σ(x+1)(y+1) / Σ((x+1)² + (y+1)²) in fp64 (DeepEP's form)."""
    a, b = x.double() + 1, y.double() + 1
    return float(1 - 2 * (a * b).sum() / (a * a + b * b).sum())


def safe_div(a: float, b: float) -> float:
    """a / b, with 0 / 0 = 0 (a nonzero numerator over zero still raises ZeroDivisionError)."""
    if b == 0 and a == 0:
        return 0
    return a / b


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


def per_token_cast_to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [m, n] -> (fp8 [m, n], fp32 [m, ceil(n/128)]): per 128-column block, amax clamped to 1e-4,
    values x · (448 / amax), scales amax / 448 (DeepEP's bytes; the last block zero-padded)."""
    if x.dim() != 2:
        raise ValueError(f"per_token_cast_to_fp8: x has {x.dim()} dims; expected [m, n]")
    m, n = x.shape
    padded = torch.nn.functional.pad(x, (0, align(n, BLOCK) - n)).view(m, -1, BLOCK)
    amax = padded.abs().float().amax(dim=2).clamp(min=1e-4)
    data = (padded * (FP8_MAX / amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, -1)[:, :n].contiguous()
    return data, amax / FP8_MAX


def per_token_cast_back(x_fp8: torch.Tensor, x_scales: torch.Tensor) -> torch.Tensor:
    """fp8 [m, n] and scales (fp32 [m, n/128], or int32 words of four UE8M0 exponents) -> bf16 [m, n]."""
    if x_fp8.numel() == 0:
        return x_fp8.to(torch.bfloat16)
    m, n = x_fp8.shape
    padded = torch.nn.functional.pad(x_fp8.view(torch.uint8), (0, align(n, BLOCK) - n)).view(torch.float8_e4m3fn)
    blocks = align(n, BLOCK) // BLOCK
    if x_scales.dtype == torch.int32:  # the last word's padding exponents are not read
        x_scales = (x_scales.contiguous().view(torch.uint8).to(torch.int32) << 23).view(torch.float32)
    values = padded.float().view(m, -1, BLOCK) * x_scales.reshape(m, -1)[:, :blocks].unsqueeze(2)
    return values.view(m, -1).to(torch.bfloat16)[:, :n].contiguous()


def inplace_unique(x: torch.Tensor, num_slots: int) -> None:
    """Each row of x (ids in [0, num_slots), negative = none) becomes its distinct ids in descending
    order, then -1 (DeepEP's test helper: ranks a token reaches)."""
    if x.dim() != 2:
        raise ValueError(f"inplace_unique: x has {x.dim()} dims; expected [rows, k]")
    present = torch.zeros(x.shape[0], num_slots + 1, dtype=torch.bool, device=x.device)
    present.scatter_(1, x.masked_fill(x < 0, num_slots).long(), True)
    ids = torch.arange(num_slots, device=x.device, dtype=x.dtype).expand(x.shape[0], -1)
    ranked = torch.where(present[:, :num_slots], ids, -1).sort(dim=1, descending=True).values
    keep = min(num_slots, x.shape[1])
    x.fill_(-1)
    x[:, :keep] = ranked[:, :keep]


def create_grouped_scores(scores: torch.Tensor, group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """scores [T, E] with every expert outside the selected groups (group_idx [T, g]) set to 0."""
    t, e = scores.shape
    keep = torch.zeros(t, num_groups, dtype=torch.bool, device=scores.device).scatter_(1, group_idx, True)
    return (scores.view(t, num_groups, -1) * keep.unsqueeze(-1)).view(t, e)


def hash_tensor(t: torch.Tensor) -> int:
    """The sum of t's bytes read as int32 words (DeepEP's checksum)."""
    return int(t.contiguous().view(torch.int32).sum().item())


def hash_tensors(*tensors: Any) -> int:
    value = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            value ^= hash_tensors(*t)
        elif isinstance(t, torch.Tensor):
            value ^= hash_tensor(t)
    return value
