"""Conformance cases for the FP8 quantizers: byte-exact against the contract's reference math."""

from __future__ import annotations

import functools

import torch

from ..quantization import (PER_TOKEN_CAST, dequantize_reference, per_block_cast_to_fp8, per_token_cast_to_fp8,
                            quantize_blocks_reference)
from ..tensors import QuantTensor
from .checks import assert_close, assert_quantization_matches
from .core import Case, conformance_cases
from .generators import randn

QUICK_SHAPES = [(1, 128), (3, 300), (64, 1024), (130, 7)]
FULL_SHAPES = QUICK_SHAPES + [(256, 7168), (2048, 7168)]


def _check(shape, block, ue8m0, seed, device) -> float:
    x = randn(*shape, seed=seed, dtype=torch.bfloat16, device=device, scale=3.0)
    if block[0] == 1:
        q = per_token_cast_to_fp8(x, gran_k=block[1], use_ue8m0=ue8m0)
    else:
        q = per_block_cast_to_fp8(x, block=block, use_ue8m0=ue8m0)
    want = QuantTensor(*quantize_blocks_reference(x.cpu(), block[0], block[1], ue8m0), block, ue8m0)
    assert_quantization_matches(q, want, exact_scales=ue8m0)
    return assert_close(dequantize_reference(q), x.float(), PER_TOKEN_CAST.tolerance.unquantized,
                        "dequantized vs input")


def _cases(op: str, block_of, quick: bool, seed0: int) -> list[Case]:
    cases = []
    for i, shape in enumerate(QUICK_SHAPES if quick else FULL_SHAPES):
        for ue8m0 in (False, True):
            block = block_of(shape)
            run = functools.partial(_check, shape, block, ue8m0, seed0 + i)
            cases.append(Case(op, f"shape={shape} block={block} ue8m0={ue8m0}", seed0 + i, run))
    return cases


@conformance_cases("per_token_cast_to_fp8")
def per_token_cases(quick: bool) -> list[Case]:
    return _cases("per_token_cast_to_fp8", lambda s: (1, 128), quick, 3000)


@conformance_cases("per_block_cast_to_fp8")
def per_block_cases(quick: bool) -> list[Case]:
    return _cases("per_block_cast_to_fp8", lambda s: (128, 128), quick, 3100)
