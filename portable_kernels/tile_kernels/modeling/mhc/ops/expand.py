"""TileKernels' `modeling.mhc.ops.expand`: expand_to_mhc over the portable mhc_expand ops."""

from __future__ import annotations

import torch

from portable_kernels.ops.mhc.expand import mhc_expand, mhc_expand_backward


class ExpandToMHCFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None) -> torch.Tensor:
        result = mhc_expand(hidden, mhc_mult)
        if out is None:
            return result
        out.copy_(result)
        return out

    @staticmethod
    def backward(ctx, out_grad: torch.Tensor):
        return mhc_expand_backward(out_grad), None, None


def expand_to_mhc(hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """hidden [..., H] -> [..., mhc_mult, H] (into `out` when given), differentiable."""
    return ExpandToMHCFn.apply(hidden, mhc_mult, out)


__all__ = ["ExpandToMHCFn", "expand_to_mhc"]
