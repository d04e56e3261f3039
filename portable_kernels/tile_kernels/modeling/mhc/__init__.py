"""TileKernels' `modeling.mhc`: the mHC layer's steps (functional) and their ops (ops)."""

from . import functional, ops
from .functional import expand_from_embedding, mhc_head, mhc_pre

__all__ = ["expand_from_embedding", "functional", "mhc_head", "mhc_pre", "ops"]
