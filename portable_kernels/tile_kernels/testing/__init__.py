"""TileKernels' `tile_kernels.testing`: the helpers its tests import, written for any device.

Modules as upstream: `numeric` (assert_equal, calc_diff, check_bias, count_bytes), `bench` (parameter
ids and keys, dtype names, output suppression, the average-performance line), `generator` (the test
grids and random inputs, on the CUDA device when there is one, else the CPU) and `quant`
(clear_unused_sf). Checks raise AssertionError, as upstream's asserts do, but also under `python -O`.
Not here: `tile_kernels.torch` (upstream's own reference oracles, which a suite runs from upstream).
"""

from . import bench, generator, numeric, quant
from .quant import clear_unused_sf

__all__ = ["bench", "clear_unused_sf", "generator", "numeric", "quant"]
