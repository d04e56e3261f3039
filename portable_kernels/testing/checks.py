"""Assertions shared by conformance cases and tests; they raise CaseFailure with the numbers."""

from __future__ import annotations

from typing import Callable

import torch

from ..layouts.fp4 import unpack_e2m1
from ..core.numerics import calc_diff
from ..ops.quant.fp8 import dequantize_reference
from ..core.tensors import QuantTensor
from ..core.contract import checks_values
from ..core.errors import ContractError
from .core import CaseFailure, CaseNotApplicable


def assert_refused(call: Callable[[], object], arg: str, *tensors: torch.Tensor) -> float:
    """`call()` raises a ContractError naming argument `arg` (a value check every provider must
    make); not applicable where value checks are off (accelerators without PK_CHECK_VALUES=1)."""
    if not checks_values(*tensors):
        raise CaseNotApplicable("value checks are off on this device (set PK_CHECK_VALUES=1 to run this case)")
    try:
        call()
    except ContractError as exc:
        if f"'{arg}'" not in str(exc):
            raise CaseFailure(f"refused, but the error does not name argument '{arg}': {exc}") from exc
        return 0.0
    raise CaseFailure(f"accepted a bad '{arg}' without a ContractError")


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
#: share of codes allowed to be a neighbour of the reference's code instead of equal to it:
#: rounding-boundary flips from last-ulp differences (the H200 flips ~0.13% of fp8 codes against
#: torch's CPU cast); a systematically wrong rounding mode flips far more
NEIGHBOUR_SHARE = 1e-2
#: calc_diff bound between the dequantized values of kernel and reference
DEQUANTIZED_BOUND = 1e-4


def _signed_codes(qt: QuantTensor) -> torch.Tensor:
    """Codes as signed magnitude ranks, so neighbouring representable values differ by one."""
    if qt.element == "e2m1":
        codes, sign_bit = unpack_e2m1(qt.data.cpu()).to(torch.int32), 0x8
    else:
        codes, sign_bit = qt.data.cpu().view(torch.uint8).to(torch.int32), 0x80
    magnitude = codes & (sign_bit - 1)
    return torch.where((codes & sign_bit) != 0, -magnitude, magnitude)


def assert_quantization_matches(q: QuantTensor, want: QuantTensor, exact_scales: bool) -> None:
    """A quantizer's output agrees with the reference quantizer's.

    Power-of-two (UE8M0) scales must be identical, other scales may differ by SCALE_RTOL; every code
    must equal the reference's or be its neighbour (at most NEIGHBOUR_SHARE of them neighbours), and
    the dequantized values must stay within DEQUANTIZED_BOUND (calc_diff) of the reference's.
    """
    scale, want_scale = q.scale.cpu(), want.scale.cpu()
    if exact_scales:
        if not torch.equal(scale, want_scale):
            raise CaseFailure(f"power-of-two scales differ from the reference in "
                              f"{int((scale != want_scale).sum())} places")
    elif not torch.allclose(scale, want_scale, rtol=SCALE_RTOL, atol=0.0):
        worst = ((scale - want_scale).abs() / want_scale.abs()).max().item()
        raise CaseFailure(f"scales differ from the reference by up to {worst:.3e} relative (allowed {SCALE_RTOL:.1e})")
    step = (_signed_codes(q) - _signed_codes(want)).abs()
    if bool((step > 1).any()):
        raise CaseFailure(f"{int((step > 1).sum())} codes are more than one step from the reference's")
    flipped = int((step == 1).sum())
    if flipped > NEIGHBOUR_SHARE * max(step.numel(), 1):
        raise CaseFailure(f"{flipped} of {step.numel()} codes differ from the reference's by one step "
                          f"(allowed share {NEIGHBOUR_SHARE})")
    assert_close(dequantize_reference(q), dequantize_reference(want), DEQUANTIZED_BOUND,
                 "dequantized vs reference quantizer")
