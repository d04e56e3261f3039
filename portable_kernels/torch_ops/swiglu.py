"""Custom op of swiglu_forward: fp32 [M, I] out; adds into `clamped_count` when given (`Tensor(c!)?`)."""

from __future__ import annotations

import torch

from ..ops import swiglu as swiglu_module
from ..core.compiled import ROUTES
from .boundary import define, fresh, op


def _impl(x, pos_to_token_topk, topk_weights, swiglu_clamp_value, clamped_count, pos_to_expert):
    out = swiglu_module.swiglu_forward(x, pos_to_token_topk, topk_weights, swiglu_clamp_value, clamped_count,
                                       pos_to_expert=pos_to_expert)
    return fresh(out, x, pos_to_token_topk, topk_weights, pos_to_expert)


def _fake(x, *args):
    return x.new_empty((x.shape[0], x.shape[1] // 2), dtype=torch.float32)


define("swiglu_forward(Tensor x, Tensor? pos_to_token_topk, Tensor? topk_weights, float? swiglu_clamp_value, "
       "Tensor(c!)? clamped_count, Tensor? pos_to_expert) -> Tensor", _impl, _fake)


def swiglu_forward(x: torch.Tensor, pos_to_token_topk: torch.Tensor | None = None,
                   topk_weights: torch.Tensor | None = None, swiglu_clamp_value: float | None = None,
                   clamped_count: torch.Tensor | None = None, *,
                   pos_to_expert: torch.Tensor | None = None) -> torch.Tensor:
    return op("swiglu_forward")(x, pos_to_token_topk, topk_weights, swiglu_clamp_value, clamped_count, pos_to_expert)


ROUTES.update(swiglu_forward=swiglu_forward)
