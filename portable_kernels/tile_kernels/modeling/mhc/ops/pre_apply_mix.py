"""TileKernels' `modeling.mhc.ops.pre_apply_mix` over mhc_pre_apply_mix and its backward (with
TileKernels' grad_from_mhc_post hand-off, see _storage)."""

from __future__ import annotations

import torch

from portable_kernels.ops.mhc.apply import mhc_pre_apply_mix as _forward
from portable_kernels.ops.mhc.apply import mhc_pre_apply_mix_backward as _backward

from . import _storage


class MHCPreApplyMix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, mix)
        result = _forward(x, mix)
        if out is None:
            return result
        out.copy_(result)
        return out

    @staticmethod
    def backward(ctx, o_grad: torch.Tensor):
        x, mix = ctx.saved_tensors
        x_grad, mix_grad = _backward(o_grad.contiguous(), x, mix)
        acc = _storage.pending(x)
        if acc is not None:
            acc.view_as(x_grad).add_(x_grad)
            x_grad = None
        return x_grad, mix_grad, None


def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_m x · mix as bf16 [..., H] (into `out` when given), differentiable."""
    return MHCPreApplyMix.apply(x, mix, out)


__all__ = ["MHCPreApplyMix", "mhc_pre_apply_mix"]
