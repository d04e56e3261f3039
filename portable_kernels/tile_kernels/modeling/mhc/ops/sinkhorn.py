"""TileKernels' `modeling.mhc.ops.sinkhorn`: sinkhorn_normalize over mhc_sinkhorn and its backward."""

from __future__ import annotations

import torch

from portable_kernels.ops.mhc.sinkhorn import mhc_sinkhorn, mhc_sinkhorn_backward


class _SinkhornNormalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.repeat, ctx.eps = repeat, eps
        return mhc_sinkhorn(x, repeat, eps)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (x,) = ctx.saved_tensors
        return mhc_sinkhorn_backward(grad_output.contiguous(), x, ctx.repeat, ctx.eps), None, None


def sinkhorn_normalize(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """x fp32 [..., M, M] -> Sinkhorn-normalized, same shape, differentiable."""
    return _SinkhornNormalize.apply(x.contiguous().view(-1, *x.shape[-2:]), repeat, eps).view_as(x)


__all__ = ["sinkhorn_normalize"]
