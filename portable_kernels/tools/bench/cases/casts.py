"""Quantization cases: the FP8 casts and the fused SwiGLU + cast against their torch math.

The peer is the contract's reference (vectorized torch: what a user writes from the recipe).
Target from issue 12: 1.5x that.
"""

from __future__ import annotations

import portable_kernels as pk
from portable_kernels.ops.swiglu import swiglu_forward_and_per_token_cast_reference
from portable_kernels.ops.quant.fp8 import quantize_blocks_reference

from ..case import TINY, Case, Inputs, seeded

FAMILY = "casts"
TITLE = "FP8 casts vs their torch math"
SOURCE = "issue 12"
ON = ("cpu",)  # issue 12 set these targets for the cpu backend
PEER = "the contract's torch math"


def _x(m: int, k: int):
    return lambda device: Inputs(x=seeded(m, k, seed=40, device=device))


def _per_token(m: int, k: int, sizes=frozenset({"quick", "full"})) -> Case:
    return Case(FAMILY, "per_token_cast_to_fp8", f"{m}x{k}", _x(m, k), lambda i: pk.per_token_cast_to_fp8(i.x),
                lambda i: quantize_blocks_reference(i.x, 1, 128, False), "per_token_cast_to_fp8", PEER,
                target=1.5, target_source=SOURCE, target_on=ON, sizes=sizes)


def _per_block(m: int, k: int, sizes=frozenset({"quick", "full"})) -> Case:
    return Case(FAMILY, "per_block_cast_to_fp8", f"{m}x{k}", _x(m, k), lambda i: pk.per_block_cast_to_fp8(i.x),
                lambda i: quantize_blocks_reference(i.x, 128, 128, False), "per_block_cast_to_fp8", PEER,
                target=1.5, target_source=SOURCE, target_on=ON, sizes=sizes)


def _swiglu(m: int, n: int, sizes=frozenset({"quick", "full"})) -> Case:
    return Case(FAMILY, "swiglu_forward_and_per_token_cast", f"{m}x(2x{n // 2})", _x(m, n),
                lambda i: pk.swiglu_forward_and_per_token_cast(i.x),
                lambda i: swiglu_forward_and_per_token_cast_reference(i.x, 128, False),
                "swiglu_forward_and_per_token_cast", PEER, target=1.5, target_source=SOURCE, target_on=ON, sizes=sizes)


CASES = [
    _per_token(4096, 7168),
    _per_block(4096, 7168),
    _swiglu(4096, 4096),
    _per_token(16, 512, sizes=TINY),
    _per_block(128, 256, sizes=TINY),
    _swiglu(16, 512, sizes=TINY),
]
