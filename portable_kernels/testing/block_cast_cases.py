"""Conformance cases for block_cast (TileKernels' cast): FP8 and FP4, per token / block / channel,
with and without power-of-two scales, given scales and a custom amax floor, against the reference."""

from __future__ import annotations

import functools

import torch

from ..ops.quant.block_cast import BLOCK_CAST, DEFAULT_CLAMP_MIN, block_cast, block_cast_reference
from ..ops.quant.fp8 import dequantize_reference
from ..core.tensors import QuantTensor
from .checks import assert_close, assert_quantization_matches, assert_refused
from .core import Case, conformance_cases
from .generators import randn

#: (shape, block): per token, per block, per channel, odd sizes and partial blocks
QUICK = [((1, 128), (1, 128)), ((3, 300), (1, 32)), ((64, 1024), (128, 128)), ((130, 8), (128, 1)),
         ((5, 70), (2, 16))]
FULL = QUICK + [((256, 7168), (1, 128)), ((512, 2048), (128, 128)), ((384, 576), (128, 1))]


def _reference(x: torch.Tensor, block: tuple[int, int], fmt: str, round_sf: bool, clamp_min: float,
               sf: torch.Tensor | None = None) -> QuantTensor:
    data, scale = block_cast_reference(x.cpu(), block, fmt, round_sf, clamp_min, None if sf is None else sf.cpu())
    return QuantTensor(data, scale, block, round_sf, fmt)


def _check(shape, block, fmt, round_sf, seed, device) -> float:
    x = randn(*shape, seed=seed, dtype=torch.bfloat16, device=device, scale=4.0)
    x[0] = 0  # an all-zero row: the amax floor decides its scale
    q = block_cast(x, fmt, block, round_sf)
    assert_quantization_matches(q, _reference(x, block, fmt, round_sf, DEFAULT_CLAMP_MIN[fmt]), exact_scales=round_sf)
    return assert_close(dequantize_reference(q), x.float(), BLOCK_CAST.tolerance.unquantized, "dequantized vs input")


def _check_given_scales(fmt, seed, device) -> float:
    x = randn(48, 256, seed=seed, device=device)
    sf = (randn(48, 2, seed=seed + 1).abs() + 0.05).to(device)
    q = block_cast(x, fmt, (1, 128), sf=sf)
    if not torch.equal(q.scale.cpu(), sf.cpu()):
        raise AssertionError("block_cast with given scales must return those scales")
    assert_quantization_matches(q, _reference(x, (1, 128), fmt, False, 0.0, sf), exact_scales=True)
    return 0.0


def _check_clamp_min(seed, device) -> float:
    x = randn(16, 256, seed=seed, device=device, scale=1e-3)
    q = block_cast(x, "e4m3", (1, 128), True, clamp_min=1.0)  # every block's amax is below the floor
    assert_quantization_matches(q, _reference(x, (1, 128), "e4m3", True, 1.0), exact_scales=True)
    return 0.0


def _refuse_nonfinite(fmt, round_sf, seed, device) -> float:
    x = randn(4, 64, seed=seed, device=device)
    x[1, 3] = float("nan")
    x[2, 40] = float("inf")
    return assert_refused(lambda: block_cast(x, fmt, (1, 32), round_sf), "x", x)


@conformance_cases("block_cast")
def block_cast_cases(quick: bool) -> list[Case]:
    cases = []
    for i, (shape, block) in enumerate(QUICK if quick else FULL):
        for fmt in ("e4m3", "e2m1"):
            for round_sf in (False, True):
                seed = 7000 + 10 * i + (2 if fmt == "e2m1" else 0) + round_sf
                cases.append(Case("block_cast", f"shape={shape} block={block} fmt={fmt} round_sf={round_sf}", seed,
                                  functools.partial(_check, shape, block, fmt, round_sf, seed)))
    for fmt in ("e4m3", "e2m1"):
        cases.append(Case("block_cast", f"given scales fmt={fmt}", 7100, functools.partial(_check_given_scales, fmt,
                                                                                            7100)))
    cases.append(Case("block_cast", "clamp_min above every amax", 7110, functools.partial(_check_clamp_min, 7110)))
    for fmt, round_sf in (("e2m1", False), ("e4m3", True)):
        cases.append(Case("block_cast", f"refuses NaN/Inf fmt={fmt} round_sf={round_sf}", 7120,
                          functools.partial(_refuse_nonfinite, fmt, round_sf, 7120)))
    return cases
