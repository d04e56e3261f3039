"""Drop-in for deepseek-ai/TileKernels: `from portable_kernels import tile_kernels` replaces
`import tile_kernels`, and the calls stay as they are.

Sub-namespaces as upstream: `moe` (gate, routing mapping, expand / reduce, counts; `moe.scoring`
with ScoringFunc), `quant` (FP8 / FP4 casts, SwiGLU + cast, cast back, the lossless FP4 -> FP8
recast, SwiGLU's backward + cast; `quant.types`, `quant.common`), `transpose`, `config` (SM
count, nominal per emulated arch without CUDA), `utils` (ceil_div, align, is_power_of_two) and
`testing` (the helpers TileKernels' tests import), `mhc` (upstream's kernel-module wrappers:
post_kernel, multilayer_recompute_kernel) and `modeling.mhc` (the mHC ops as autograd Functions,
`modeling.mhc.ops` / `modeling.mhc.functional`). Every name keeps TileKernels' positional
order, keywords, defaults, return tuples and dtypes (FP4 packed as int8, scales as fp32 or, with
`use_packed_ue8m0`, int32 words), and runs the portable ops underneath,
so it works on every backend. Where TileKernels' bytes differ from the top-level API's choice the
names here produce TileKernels' bytes: FP8/FP4 casts multiply by max/amax (`block_cast`), an
all-zero FP4 block gets the scale 2^-126. Not provided (see docs/porting.md): `engram`
(model-specific training kernels), TileKernels' TileLang kernel builders; `tile_kernels.torch`
(TileKernels' own reference oracles, run from upstream).
"""

from . import config, mhc, modeling, moe, quant, testing, transpose, utils
from .config import get_device_num_sms, get_num_sms, set_num_sms

__all__ = ["config", "get_device_num_sms", "get_num_sms", "mhc", "modeling", "moe", "quant", "set_num_sms", "testing",
           "transpose", "utils"]
