"""TileKernels' `modeling.mhc.ops.post`: mhc_post (differentiable) and the bare mhc_post_fwd /
mhc_post_bwd over the portable mhc_post ops."""

from __future__ import annotations

import torch

from portable_kernels.ops.mhc.apply import mhc_post as _forward
from portable_kernels.ops.mhc.apply import mhc_post_backward as _backward

from . import _storage


def mhc_post_fwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    result = _forward(x, residual, post_layer_mix, comb_res_mix)
    if out is None:
        return result
    out.copy_(result)
    return out


def mhc_post_bwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 d_o: torch.Tensor, fuse_grad_acc: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d_x, d_residual, d_post_layer_mix, d_comb_res_mix); with fuse_grad_acc, d_residual is also left
    on residual's storage for the pre ops' backward to add into."""
    d_x, d_residual, d_post, d_comb = _backward(d_o.contiguous(), x, residual, post_layer_mix, comb_res_mix)
    if fuse_grad_acc:
        _storage.leave(residual, d_residual)
    return d_x, d_residual, d_post, d_comb


class MHCPost(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                comb_res_mix: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, residual, post_layer_mix, comb_res_mix)
        return mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix, out)

    @staticmethod
    def backward(ctx, d_o: torch.Tensor):
        return (*mhc_post_bwd(*ctx.saved_tensors, d_o), None)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """The next residual streams bf16 [..., M, H], differentiable."""
    return MHCPost.apply(x, residual, post_layer_mix, comb_res_mix, out)


__all__ = ["MHCPost", "mhc_post", "mhc_post_bwd", "mhc_post_fwd"]
