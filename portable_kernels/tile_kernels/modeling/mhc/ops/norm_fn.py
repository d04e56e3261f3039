"""TileKernels' `modeling.mhc.ops.norm_fn`: mhc_pre_norm_fn over the portable mhc_pre_norm_fn ops.
The RMSNorm weight is folded into fn by a torch product (its gradient by autograd; TileKernels'
`main_grad` accumulation is not reproduced). `n_splits` is accepted and has no effect: the
contract's sums are whole-K."""

from __future__ import annotations

import torch

from portable_kernels.ops.mhc.norm_fn import mhc_pre_norm_fn as _forward
from portable_kernels.ops.mhc.norm_fn import mhc_pre_norm_fn_backward as _backward

from . import _storage


class MHCPreNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, fn: torch.Tensor, norm_eps: float, fuse_grad_acc: bool,
                n_splits: int) -> torch.Tensor:
        ctx.save_for_backward(x, fn)
        ctx.norm_eps, ctx.fuse_grad_acc = norm_eps, fuse_grad_acc
        return _forward(x, fn, norm_eps)

    @staticmethod
    def backward(ctx, out_grad: torch.Tensor):
        x, fn = ctx.saved_tensors
        x_grad, fn_grad = _backward(out_grad.contiguous(), x, fn, ctx.norm_eps)
        acc = _storage.pending(x) if ctx.fuse_grad_acc else None
        if acc is not None:
            acc.view_as(x_grad).add_(x_grad)
            _storage.take(x)
            x_grad = None
        return x_grad, fn_grad, None, None, None


def mhc_pre_norm_fn(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                    mhc_norm_eps: float, fuse_grad_acc: bool = True, n_splits: int = 16) -> torch.Tensor:
    """The RMS-normalized projection fp32 [..., M3] of residual bf16 [..., M, H], differentiable."""
    if mhc_norm_weight is not None:
        mhc_fn = mhc_fn * mhc_norm_weight
    return MHCPreNormFn.apply(residual, mhc_fn, mhc_norm_eps, fuse_grad_acc, n_splits)


__all__ = ["MHCPreNormFn", "mhc_pre_norm_fn"]
