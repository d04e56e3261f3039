"""TileKernels' `modeling.mhc.ops.pre_big_fuse`: the inference path of mhc_pre (no gradients). Here
it is the composition of the four portable ops — pre_norm_fn, pre_split_mixes, sinkhorn,
pre_apply_mix — run one after the other (no fused kernel), so its results are bit-identical to
calling them in turn, which is what TileKernels' test asks."""

from __future__ import annotations

import torch

from portable_kernels.core.checks import fail
from portable_kernels.ops.mhc.apply import mhc_pre_apply_mix
from portable_kernels.ops.mhc.mixes import mhc_pre_split_mixes
from portable_kernels.ops.mhc.norm_fn import mhc_pre_norm_fn
from portable_kernels.ops.mhc.sinkhorn import mhc_sinkhorn

OP = "mhc_pre_big_fuse"


def mhc_pre_big_fuse(residual: torch.Tensor, fn: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                     rms_eps: float, mhc_pre_eps: float, mhc_sinkhorn_eps: float, mhc_post_mult_value: float,
                     sinkhorn_repeat: int, n_splits: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(post_mix fp32 [..., M, 1], comb_mix fp32 [..., M, M], layer_input bf16 [..., H]); n_splits has no
    effect (whole-K sums)."""
    if not isinstance(residual, torch.Tensor) or residual.dim() < 3:
        fail(OP, "residual", repr(getattr(residual, "shape", residual)), "a bf16 tensor [..., M, H] with at least "
             "one token dim", "pass the residual streams")
    mhc_mult = residual.shape[-2]
    outer = residual.shape[:-2]
    flat = residual.reshape(1, -1, *residual.shape[-2:])
    with torch.no_grad():
        mixes = mhc_pre_norm_fn(flat, fn, rms_eps)
        pre_mix, post_mix, comb_mix = mhc_pre_split_mixes(mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value,
                                                          mhc_pre_eps)
        comb_mix = mhc_sinkhorn(comb_mix, sinkhorn_repeat, mhc_sinkhorn_eps)
        layer_input = mhc_pre_apply_mix(flat, pre_mix)
    return (post_mix.view(*outer, mhc_mult, 1), comb_mix.view(*outer, mhc_mult, mhc_mult),
            layer_input.view(*outer, residual.shape[-1]))


__all__ = ["mhc_pre_big_fuse"]
