"""`portable_kernels.deep_select`: DeepSelect's public names with DeepSelect's signatures.

Porting is one import: `import portable_kernels.deep_select as deep_select`. `topk` is
portable_kernels.topk (which takes DeepSelect's full signature); `get_stride_requirement` returns
DeepSelect's CUDA values. What differs, and why: docs/porting.md.
"""

from __future__ import annotations

import functools

from ..ops.topk import NAN_ROW_MARKER, topk

__all__ = ["topk", "get_stride_requirement", "NAN_ROW_MARKER"]

#: DeepSelect's CUDA stride requirements in bytes: (input row stride, output row stride)
STRIDE_REQUIREMENT = (16, 32)


@functools.lru_cache(maxsize=1)
def get_stride_requirement() -> tuple[int, int]:
    """(input, output) row-stride multiples in bytes DeepSelect's CUDA kernels want: (16, 32). Rows of
    any stride work here; code that pads its rows to these multiples keeps working unchanged."""
    return STRIDE_REQUIREMENT
