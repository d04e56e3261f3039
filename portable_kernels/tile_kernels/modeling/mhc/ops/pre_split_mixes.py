"""TileKernels' `modeling.mhc.ops.pre_split_mixes` over mhc_pre_split_mixes and its backward."""

from __future__ import annotations

import torch

from portable_kernels.ops.mhc.mixes import mhc_pre_split_mixes as _forward
from portable_kernels.ops.mhc.mixes import mhc_pre_split_mixes_backward as _backward


class MHCPreSplitMixes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                mhc_post_mult_value: float, mhc_pre_eps: float):
        ctx.save_for_backward(input_mixes, mhc_scale, mhc_base)
        ctx.mhc_mult, ctx.post_mult_value = mhc_mult, mhc_post_mult_value
        return _forward(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)

    @staticmethod
    def backward(ctx, pre_grad: torch.Tensor, post_grad: torch.Tensor, comb_grad: torch.Tensor):
        input_mixes, scale, base = ctx.saved_tensors
        a, b, _ = input_mixes.shape
        m = ctx.mhc_mult
        shapes = ((a, b, m, 1), (a, b, m, 1), (a, b, m, m))
        grads = [input_mixes.new_zeros(shape) if g is None else g.contiguous()
                 for g, shape in zip((pre_grad, post_grad, comb_grad), shapes)]
        d_in, d_scale, d_base = _backward(*grads, input_mixes, scale, base, ctx.mhc_mult, ctx.post_mult_value)
        return d_in, d_scale, d_base, None, None, None


def mhc_pre_split_mixes(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                        mhc_post_mult_value: float, mhc_pre_eps: float
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre [A, B, M, 1], post [A, B, M, 1], comb [A, B, M, M]) from the projected mixes, differentiable."""
    return MHCPreSplitMixes.apply(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)


__all__ = ["MHCPreSplitMixes", "mhc_pre_split_mixes"]
