"""Assertions shared by conformance cases and tests; they raise CaseFailure with the numbers."""

from __future__ import annotations

import torch

from ..numerics import calc_diff
from .core import CaseFailure


def assert_written(out: torch.Tensor, what: str = "output") -> None:
    """Every element of a poisoned output was overwritten with a finite value."""
    bad = ~torch.isfinite(out.float())
    if bad.any():
        raise CaseFailure(f"{what}: {int(bad.sum())} of {out.numel()} elements not written (still poisoned) "
                          f"or not finite")


def assert_close(out: torch.Tensor, reference: torch.Tensor, bound: float, what: str = "output") -> float:
    """calc_diff(out, reference) <= bound; returns the diff."""
    diff = calc_diff(out.cpu(), reference.cpu())
    if not diff <= bound:
        raise CaseFailure(f"{what}: calc_diff {diff:.3e} exceeds {bound:.1e}")
    return diff
