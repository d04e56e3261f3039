"""TileKernels' `modeling`: the model-level training ops. Provided: `mhc` (manifold hyper-connections);
not provided: `engram`."""

from . import mhc

__all__ = ["mhc"]
