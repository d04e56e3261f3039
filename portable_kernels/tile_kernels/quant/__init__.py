"""TileKernels' `tile_kernels.quant`: FP8 / FP4 casts with TileKernels' bytes and scale storage,
SwiGLU + cast, cast back, FP4 unpacking, the lossless FP4 -> FP8 recast and SwiGLU's backward + cast.
Modules: `casts`, `swiglu`, `lossless`, `types` (QuantTensor),
`common` (unpack_from_e2m1fn_x2, where TileKernels' reference oracles import it), `_scales` (scale
storage through the layouts' packers)."""

from . import common
from .casts import (cast_back, per_block_cast, per_block_cast_with_precomputed_sf, per_block_cast_with_sf_only,
                    per_channel_cast, per_channel_cast_and_transpose, per_channel_cast_fused, per_token_cast,
                    per_token_cast_back, per_token_cast_with_precomputed_sf, per_token_cast_with_sf_only,
                    unpack_from_e2m1fn_x2)
from .lossless import per_block_cast_lossless, swiglu_backward_and_per_token_cast
from .swiglu import swiglu_forward_and_per_channel_cast_and_transpose, swiglu_forward_and_per_token_cast
from .types import QuantTensor

__all__ = ["QuantTensor", "cast_back", "common", "per_block_cast", "per_block_cast_with_precomputed_sf",
           "per_block_cast_lossless", "per_block_cast_with_sf_only", "per_channel_cast", "per_channel_cast_and_transpose",
           "per_channel_cast_fused", "per_token_cast", "per_token_cast_back", "per_token_cast_with_precomputed_sf",
           "per_token_cast_with_sf_only", "swiglu_forward_and_per_channel_cast_and_transpose",
           "swiglu_backward_and_per_token_cast", "swiglu_forward_and_per_token_cast", "unpack_from_e2m1fn_x2"]
