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
