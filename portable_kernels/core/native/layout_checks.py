"""Native checks of layout values on CPU tensors (C++ in layout_checks.cpp): the same verdicts as
the torch checks they front, in one pass instead of ~20 tensor ops (~120 µs for a decode step's
m_indices). The torch checks stay the definition and write every error message: a caller runs them
whenever the native check is not applicable or finds a problem."""

from __future__ import annotations

from pathlib import Path

import torch

from .build import I64, PTR, NativeLibrary, register_library

LIB = register_library(NativeLibrary("layout_checks", Path(__file__).with_name("layout_checks.cpp"), {
    "pk_check_m_indices": [PTR, I64, I64, I64],
}, returns={"pk_check_m_indices": I64}))


def m_indices_is_contiguous_layout(m_indices: torch.Tensor, num_groups: int, alignment: int) -> bool | None:
    """True when m_indices (int32 [M]) is the contiguous layout of its own counts for `alignment`
    rows; False when it is not; None when the native check does not apply (not a contiguous CPU
    int32 vector, or no native library) — then only the torch check can tell."""
    if m_indices.device.type != "cpu" or m_indices.dtype != torch.int32 or m_indices.dim() != 1 \
            or not m_indices.is_contiguous() or alignment < 1:
        return None
    lib = LIB.get()
    if lib is None:
        return None
    return lib.pk_check_m_indices(m_indices.data_ptr(), m_indices.numel(), num_groups, alignment) == -1
