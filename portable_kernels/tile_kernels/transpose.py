"""TileKernels' `tile_kernels.transpose`: (batched) matrix transposes into new contiguous tensors.

Pure data movement, done by torch's own copy on whatever device holds x (TileKernels needs sides
divisible by 64 for its tiled kernel; any sizes work here).
"""

from __future__ import annotations

import torch

from ..core.errors import ContractError, format_problem
from ..core.tensors import describe


def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    """[B, M, N] -> a new contiguous [B, N, M]."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ContractError(format_problem("batched_transpose", "x", describe(x), "a 3-D tensor [B, M, N]",
                                           "use transpose() for one matrix"))
    return x.transpose(1, 2).contiguous()


def transpose(x: torch.Tensor) -> torch.Tensor:
    """[M, N] -> a new contiguous [N, M]."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ContractError(format_problem("transpose", "x", describe(x), "a 2-D tensor [M, N]",
                                           "use batched_transpose() for [B, M, N]"))
    return batched_transpose(x.unsqueeze(0)).squeeze(0)
