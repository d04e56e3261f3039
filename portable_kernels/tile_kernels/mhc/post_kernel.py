"""TileKernels' `mhc.post_kernel` wrappers: mhc_post_fwd, mhc_post_bwd (over the portable mhc_post ops)."""

from ..modeling.mhc.ops.post import mhc_post_bwd, mhc_post_fwd

__all__ = ["mhc_post_bwd", "mhc_post_fwd"]
