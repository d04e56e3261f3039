"""Small shared helpers: integer arithmetic and argument checks that raise LayoutConversionError."""

from __future__ import annotations

import sys

import torch

from .errors import LayoutConversionError

# Packed words are built by viewing byte tensors as int16/int32; that equals the documented
# little-endian formula only on a little-endian host (x86, ARM, every CUDA and Ascend device).
if sys.byteorder != "little":  # pragma: no cover - no big-endian host runs torch for these chips
    raise ImportError("portable_kernels.layouts assumes a little-endian host")

# Integer dtype of the same width, used to move bytes of any dtype (fp8 included) exactly.
_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def align(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def as_int_bits(x: torch.Tensor) -> torch.Tensor:
    """View `x` as the integer dtype of the same width (no copy), so copies and compares are bit-exact."""
    return x.view(_SAME_WIDTH_INT[x.element_size()])


def require_dtype(name: str, x: torch.Tensor, dtypes: tuple[torch.dtype, ...], fix: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise LayoutConversionError(f"{name} must be a torch.Tensor, got {type(x).__name__}; {fix}")
    if x.dtype not in dtypes:
        wanted = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise LayoutConversionError(f"{name} has dtype {str(x.dtype).replace('torch.', '')}, expected {wanted}; {fix}")


def require_ndim(name: str, x: torch.Tensor, ndims: tuple[int, ...], shape_doc: str) -> None:
    if x.dim() not in ndims:
        raise LayoutConversionError(f"{name} has shape {tuple(x.shape)}, expected {shape_doc}")


def require_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LayoutConversionError(f"{name} must be a positive int, got {value!r}")
