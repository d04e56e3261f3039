"""TileKernels' `tile_kernels.quant.common` as its reference oracles import it: `unpack_from_e2m1fn_x2`
(the same function as `tile_kernels.quant.unpack_from_e2m1fn_x2`). Its other names configure
TileLang kernels and have no meaning over the portable ops."""

from __future__ import annotations

from .casts import unpack_from_e2m1fn_x2

__all__ = ["unpack_from_e2m1fn_x2"]
