"""Custom op of swiglu_forward: fp32 [M, I] out; adds into `clamped_count` when given (`Tensor(c!)?`).
Schema, route and implementation come from the public signature (`declare.custom_op`)."""

from __future__ import annotations

from typing import Any

import torch

from ..ops import swiglu as swiglu_module
from .declare import custom_op


def _fake(x: torch.Tensor, **_: Any) -> torch.Tensor:
    return x.new_empty((x.shape[0], x.shape[1] // 2), dtype=torch.float32)


custom_op(swiglu_module.swiglu_forward, writes=("clamped_count",), returns="Tensor", fake=_fake)


from ..ops import swiglu_backward as swiglu_backward_module  # noqa: E402


def _backward_fake(x_data: torch.Tensor, x_sf: torch.Tensor, grad_out: torch.Tensor, weight: torch.Tensor,
                   *_: Any, **__: Any) -> tuple[torch.Tensor, ...]:
    m, two_h = x_data.shape
    return (x_data.new_empty((m, two_h // 2), dtype=torch.bfloat16), torch.empty_like(x_data),
            torch.empty_like(x_sf), x_data.new_empty((m, two_h), dtype=torch.bfloat16), torch.empty_like(weight))


custom_op(swiglu_backward_module.swiglu_backward_and_per_token_cast,
          returns="(Tensor out, Tensor x_grad_fp8, Tensor x_grad_sf, Tensor x_grad, Tensor weight_grad)",
          fake=_backward_fake)
