"""TileKernels' `mhc`: upstream's kernel modules (TileLang kernel builders and their Python
wrappers). The wrappers user code calls are here with upstream's module names and signatures, over
the portable ops: `post_kernel.mhc_post_fwd / mhc_post_bwd`, `multilayer_recompute_kernel.
mhc_multilayer_recompute`, `pre_big_fuse` (via modeling). The TileLang kernel builders themselves
(`_mhc_*_fwd(...)` returning a compiled kernel) are not provided: there is no TileLang here."""

from . import multilayer_recompute_kernel, post_kernel
from .multilayer_recompute_kernel import mhc_multilayer_recompute
from .post_kernel import mhc_post_bwd, mhc_post_fwd

__all__ = ["mhc_multilayer_recompute", "mhc_post_bwd", "mhc_post_fwd", "multilayer_recompute_kernel", "post_kernel"]
