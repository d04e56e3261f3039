"""TileKernels' `mhc.multilayer_recompute_kernel` wrapper: mhc_multilayer_recompute."""

from ..modeling.mhc.ops.multilayer_recompute import mhc_multilayer_recompute

__all__ = ["mhc_multilayer_recompute"]
