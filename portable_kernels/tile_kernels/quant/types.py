"""TileKernels' `QuantTensor` type: a plain (data, scale factors) tuple."""

from __future__ import annotations

import torch

QuantTensor = tuple[torch.Tensor, torch.Tensor]
