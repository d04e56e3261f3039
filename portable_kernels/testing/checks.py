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


#: relative distance allowed between a kernel's fp32 scales and the reference's: torch on a GPU
#: divides by a scalar as a multiply by its reciprocal, and real kernels may too (a few ulp)
SCALE_RTOL = 2.0 ** -21
#: share of quantized codes allowed to differ from the reference (rounding-boundary flips caused
#: by those last-ulp scale differences), and the calc_diff bound on the dequantized values
CODE_MISMATCH_SHARE = 1e-3
DEQUANTIZED_BOUND = 1e-6


def assert_quantization_matches(scale: torch.Tensor, values: torch.Tensor, codes: torch.Tensor,
                                want_scale: torch.Tensor, want_values: torch.Tensor, want_codes: torch.Tensor,
                                exact_scales: bool) -> None:
    """A quantizer's output agrees with the reference quantizer.

    Power-of-two (UE8M0) scales must be identical; other scales may differ by SCALE_RTOL. The codes
    (fp8 bytes or packed e2m1 bytes) may differ in at most CODE_MISMATCH_SHARE of places, and the
    dequantized values must stay within DEQUANTIZED_BOUND of the reference's.
    """
    scale, want_scale = scale.cpu(), want_scale.cpu()
    if exact_scales:
        if not torch.equal(scale, want_scale):
            raise CaseFailure(f"power-of-two scales differ from the reference in "
                              f"{int((scale != want_scale).sum())} places")
    elif not torch.allclose(scale, want_scale, rtol=SCALE_RTOL, atol=0.0):
        worst = ((scale - want_scale).abs() / want_scale.abs()).max().item()
        raise CaseFailure(f"scales differ from the reference by up to {worst:.3e} relative (allowed {SCALE_RTOL:.1e})")
    mismatched = int((codes.cpu() != want_codes.cpu()).sum())
    if mismatched > CODE_MISMATCH_SHARE * max(codes.numel(), 1):
        raise CaseFailure(f"{mismatched} of {codes.numel()} quantized bytes differ from the reference")
    assert_close(values, want_values, DEQUANTIZED_BOUND, "dequantized vs reference quantizer")
