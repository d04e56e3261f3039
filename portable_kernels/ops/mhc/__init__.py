"""mHC (manifold hyper-connections, DeepSeek-V4's residual streams): TileKernels' `mhc` ops as
contracts, forward and backward each its own op so a backend can provide a native kernel for
either. One module per op group: expand, sinkhorn, mixes (pre_split_mixes, head_compute_mix),
apply (pre_apply_mix, post), norm_fn. The autograd formulation over them is in `functional`."""

from .apply import mhc_post, mhc_post_backward, mhc_pre_apply_mix, mhc_pre_apply_mix_backward
from .expand import mhc_expand, mhc_expand_backward
from .mixes import (mhc_head_compute_mix, mhc_head_compute_mix_backward, mhc_pre_split_mixes,
                    mhc_pre_split_mixes_backward)
from .norm_fn import mhc_pre_norm_fn, mhc_pre_norm_fn_backward
from .sinkhorn import mhc_sinkhorn, mhc_sinkhorn_backward

__all__ = ["mhc_expand", "mhc_expand_backward", "mhc_head_compute_mix", "mhc_head_compute_mix_backward",
           "mhc_post", "mhc_post_backward", "mhc_pre_apply_mix", "mhc_pre_apply_mix_backward", "mhc_pre_norm_fn",
           "mhc_pre_norm_fn_backward", "mhc_pre_split_mixes", "mhc_pre_split_mixes_backward", "mhc_sinkhorn",
           "mhc_sinkhorn_backward"]
