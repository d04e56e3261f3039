"""Conformance cases for per_token_cast_to_e5m6 (TileKernels' E5M6 cast): per row and per block,
with and without power-of-two scales, E5M6's edge values, NaN/Inf, bytes against the reference."""

from __future__ import annotations

import functools

import torch

from ..layouts.e5m6 import E5M6_MAX
from ..ops.quant.e5m6 import PER_TOKEN_CAST_E5M6, e5m6_cast_back, e5m6_cast_reference, per_token_cast_to_e5m6
from .checks import assert_close, assert_refused
from .core import Case, conformance_cases
from .generators import randn

#: (shape, num_per_channels): one block per row, several blocks, a partial trailing block, one row
QUICK = [((4, 128), 128), ((33, 512), 64), ((5, 200), 64), ((1, 8), 8)]
FULL = QUICK + [((256, 7168), 7168), ((130, 4096), 128)]
#: E5M6's smallest subnormal, largest subnormal and smallest normal (TileKernels' special inputs)
SPECIAL_VALUES = (2.0 ** -20, 2.0 ** -14 * 63 / 64, 2.0 ** -14)


def _same_bytes(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    data, sf = (t.cpu() for t in got)
    if data.dtype != torch.uint8 or data.shape != want[0].shape or not torch.equal(data, want[0]):
        raise AssertionError(f"E5M6 bytes differ from the reference: {describe_diff(data, want[0])}")
    if sf.dtype != torch.float32 or not torch.equal(sf.view(torch.int32), want[1].view(torch.int32)):
        raise AssertionError("E5M6 scales differ from the reference")


def describe_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    return f"{int((a != b).sum())} of {a.numel()} bytes"


def _check(shape, per, round_sf, seed, device) -> float:
    x = randn(*shape, seed=seed, dtype=torch.bfloat16, device=device, scale=4.0)
    x[0, : min(per, shape[1])] = 0  # an all-zero block: the amax floor decides its scale
    got = per_token_cast_to_e5m6(x, per, round_sf)
    _same_bytes(got, e5m6_cast_reference(x.cpu(), per, round_sf))
    back = e5m6_cast_back(got[0], got[1], (1, per), torch.float32)
    return assert_close(back, x.float(), PER_TOKEN_CAST_E5M6.tolerance.unquantized, "cast back vs input")


def _check_special(value, round_sf, seed, device) -> float:
    x = torch.full((6, 64), value, dtype=torch.float32, device=device)
    x[:, -1] = E5M6_MAX
    x[1] = -x[1]
    x[2, 5] = -0.0
    got = per_token_cast_to_e5m6(x, 64, round_sf)
    _same_bytes(got, e5m6_cast_reference(x.cpu(), 64, round_sf))
    back = e5m6_cast_back(got[0], got[1], (1, 64), torch.float32)
    return assert_close(back, x, 5e-6, "cast back vs special input")


def _check_nonfinite(seed, device) -> float:
    x = randn(4, 64, seed=seed, device=device)
    x[1, 3] = float("nan")
    x[2, 40] = float("inf")
    _same_bytes(per_token_cast_to_e5m6(x, 32, False), e5m6_cast_reference(x.cpu(), 32, False))
    return 0.0


def _refuse_nonfinite(seed, device) -> float:
    x = randn(4, 64, seed=seed, device=device)
    x[2, 40] = float("inf")
    return assert_refused(lambda: per_token_cast_to_e5m6(x, 32, True), "x", x)


@conformance_cases("per_token_cast_to_e5m6")
def e5m6_cases(quick: bool) -> list[Case]:
    op = PER_TOKEN_CAST_E5M6.name
    cases = []
    for i, (shape, per) in enumerate(QUICK if quick else FULL):
        for round_sf in (False, True):
            seed = 7500 + 10 * i + round_sf
            cases.append(Case(op, f"shape={shape} per={per} round_sf={round_sf}", seed,
                              functools.partial(_check, shape, per, round_sf, seed)))
    for j, value in enumerate(SPECIAL_VALUES):
        for round_sf in (False, True):
            cases.append(Case(op, f"special value {value:.3g} round_sf={round_sf}", 7600 + j,
                              functools.partial(_check_special, value, round_sf, 7600 + j)))
    cases.append(Case(op, "NaN/Inf propagate without round_sf", 7610, functools.partial(_check_nonfinite, 7610)))
    cases.append(Case(op, "refuses NaN/Inf with round_sf", 7620, functools.partial(_refuse_nonfinite, 7620)))
    return cases
