"""TileKernels' `modeling.mhc.ops.head_compute_mix` over mhc_head_compute_mix and its backward."""

from __future__ import annotations

import torch

from portable_kernels.ops.mhc.mixes import mhc_head_compute_mix as _forward
from portable_kernels.ops.mhc.mixes import mhc_head_compute_mix_backward as _backward


class MHCHeadComputeMix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                mhc_pre_eps: float) -> torch.Tensor:
        ctx.save_for_backward(input_mix, mhc_scale, mhc_base)
        return _forward(input_mix, mhc_scale, mhc_base, mhc_pre_eps)

    @staticmethod
    def backward(ctx, output_mix_grad: torch.Tensor):
        return (*_backward(output_mix_grad.contiguous(), *ctx.saved_tensors), None)


def mhc_head_compute_mix(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                         mhc_pre_eps: float) -> torch.Tensor:
    """sigmoid(input_mix · scale + base) + pre_eps, differentiable."""
    return MHCHeadComputeMix.apply(input_mix, mhc_scale, mhc_base, mhc_pre_eps)


__all__ = ["MHCHeadComputeMix", "mhc_head_compute_mix"]
