"""Conformance cases for the FP8 quantizers: against the contract's reference math (codes within one
step, power-of-two scales exact), and byte for byte in the "deep_gemm" convention, whose whole
point is reproducing DeepGEMM's bytes."""

from __future__ import annotations

import functools

import torch

from ..ops.gemm.dense import fp8_gemm_nt
from ..ops.quant.fp8 import (PER_TOKEN_CAST, dequantize, dequantize_reference, per_block_cast_to_fp8,
                            per_channel_cast_to_fp8, per_token_cast_to_fp8, quantize_blocks_reference)
from ..core.tensors import PreparedTensor, QuantTensor
from .checks import assert_close, assert_quantization_matches, assert_refused
from .core import Case, CaseFailure, conformance_cases
from .generators import randn

QUICK_SHAPES = [(1, 128), (3, 300), (64, 1024), (130, 7)]
FULL_SHAPES = QUICK_SHAPES + [(256, 7168), (2048, 7168)]


def _cast(x: torch.Tensor, block: tuple[int, int], ue8m0: bool, convention: str = "portable") -> QuantTensor:
    if block[0] == 1:
        return per_token_cast_to_fp8(x, gran_k=block[1], use_ue8m0=ue8m0, convention=convention)
    if block[1] == 1:
        return per_channel_cast_to_fp8(x, gran_k=block[0], use_ue8m0=ue8m0, convention=convention)
    return per_block_cast_to_fp8(x, block=block, use_ue8m0=ue8m0, convention=convention)


def _check(shape, block, ue8m0, convention, seed, device) -> float:
    x = randn(*shape, seed=seed, dtype=torch.bfloat16, device=device, scale=3.0)
    q = _cast(x, block, ue8m0, convention)
    want = QuantTensor(*quantize_blocks_reference(x.cpu(), block[0], block[1], ue8m0, convention), block, ue8m0)
    if convention == "portable":
        assert_quantization_matches(q, want, exact_scales=ue8m0)
    elif not (torch.equal(q.data.cpu().view(torch.uint8), want.data.view(torch.uint8))
              and torch.equal(q.scale.cpu(), want.scale)):
        raise CaseFailure(f"convention {convention!r} promises its library's bytes: "
                          f"{int((q.data.cpu().view(torch.uint8) != want.data.view(torch.uint8)).sum())} data bytes "
                          f"and {int((q.scale.cpu() != want.scale).sum())} scales differ")
    return assert_close(dequantize_reference(q), x.float(), PER_TOKEN_CAST.tolerance.unquantized,
                        "dequantized vs input")


def _check_prepared(shape, block, ue8m0, seed, device) -> float:
    """With prepare_for=fp8_gemm_nt the result is in the selected backend's Format and carries the
    reference's numbers exactly (a provider may write that Format directly)."""
    x = randn(*shape, seed=seed, dtype=torch.bfloat16, device=device, scale=3.0)
    if block[0] == 1:
        q = per_token_cast_to_fp8(x, gran_k=block[1], use_ue8m0=ue8m0, prepare_for=fp8_gemm_nt)
    else:
        q = per_block_cast_to_fp8(x, block=block, use_ue8m0=ue8m0, prepare_for=fp8_gemm_nt)
    if not isinstance(q, PreparedTensor):
        raise CaseFailure(f"prepare_for returned {type(q).__name__}, not a PreparedTensor")
    want = QuantTensor(*quantize_blocks_reference(x.cpu(), block[0], block[1], ue8m0), block, ue8m0)
    got, ref = dequantize(q).cpu(), dequantize_reference(want)
    if not torch.equal(got, ref):
        raise CaseFailure(f"prepared result ({q.tag}) differs from the reference in {int((got != ref).sum())} values")
    return 0.0


def _refuses_nonfinite(block, seed, device) -> float:
    """With power-of-two scales a NaN/Inf block has no scale: refused, naming 'x'."""
    x = randn(4, 256, seed=seed, dtype=torch.bfloat16, device=device)
    x[1, 7] = float("nan")
    x[2, 200] = float("inf")
    return assert_refused(lambda: _cast(x, block, True), "x", x)


def _cases(op: str, block_of, quick: bool, seed0: int) -> list[Case]:
    cases = []
    for i, shape in enumerate(QUICK_SHAPES if quick else FULL_SHAPES):
        for ue8m0 in (False, True):
            block = block_of(shape)
            for convention in ("portable", "deep_gemm"):
                run = functools.partial(_check, shape, block, ue8m0, convention, seed0 + i)
                cases.append(Case(op, f"shape={shape} block={block} ue8m0={ue8m0} convention={convention}", seed0 + i,
                                  run))
            if block[1] == 1:
                continue  # per-channel scales feed the K-grouped GEMMs, which take no prepared operands
            run = functools.partial(_check_prepared, shape, block, ue8m0, seed0 + i)
            cases.append(Case(op, f"prepare_for=fp8_gemm_nt shape={shape} block={block} ue8m0={ue8m0}", seed0 + i,
                              run))
    block = block_of((4, 256))
    cases.append(Case(op, "refuses NaN/Inf with ue8m0", seed0 + 99, functools.partial(_refuses_nonfinite, block,
                                                                                          seed0 + 99)))
    return cases


@conformance_cases("per_token_cast_to_fp8")
def per_token_cases(quick: bool) -> list[Case]:
    return _cases("per_token_cast_to_fp8", lambda s: (1, 128), quick, 3000)


@conformance_cases("per_block_cast_to_fp8")
def per_block_cases(quick: bool) -> list[Case]:
    return _cases("per_block_cast_to_fp8", lambda s: (128, 128), quick, 3100)


@conformance_cases("per_channel_cast_to_fp8")
def per_channel_cases(quick: bool) -> list[Case]:
    return _cases("per_channel_cast_to_fp8", lambda s: (128, 1), quick, 3200)
