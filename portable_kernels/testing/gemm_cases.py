"""Conformance cases for fp8_gemm_nt and bf16_gemm_nt: DeepSeek shapes scaled down plus edges."""

from __future__ import annotations

import functools

import torch

from ..ops.gemm.dense import FP8_GEMM_NT, bf16_gemm_nt, fp8_gemm_nt, gemm_reference
from ..core.prepare import prepare_inputs
from ..ops.quant.fp8 import dequantize_reference, per_block_cast_to_fp8, per_token_cast_to_fp8
from .checks import assert_close, assert_written
from .core import Case, conformance_cases
from .generators import poison, randn

#: calc_diff bound against the fp64 reference when D is rounded to bf16 (the rounding dominates)
BF16_OUTPUT_BOUND = 1e-5

QUICK_SHAPES = [(1, 128, 128), (3, 130, 300), (0, 64, 256), (64, 256, 1024), (17, 1, 7)]
FULL_SHAPES = QUICK_SHAPES + [(128, 2048, 7168), (256, 576, 2048), (5, 7168, 512)]


def _fp8_case(m: int, n: int, k: int, out_dtype: torch.dtype, with_c: bool, ue8m0: bool, seed: int,
              device: torch.device) -> float:
    x = randn(m, k, seed=seed, dtype=torch.bfloat16, device=device)
    w = randn(n, k, seed=seed + 1, dtype=torch.bfloat16, device=device, scale=k ** -0.5)
    a = per_token_cast_to_fp8(x, use_ue8m0=ue8m0)
    b = per_block_cast_to_fp8(w, use_ue8m0=ue8m0)
    prepared = prepare_inputs(fp8_gemm_nt, a=a, b=b)
    c = randn(m, n, seed=seed + 2, device=device) if with_c else None
    d = poison(m, n, dtype=out_dtype, device=device)
    fp8_gemm_nt(prepared["a"], prepared["b"], d, c=c)
    assert_written(d, "d")
    ref = gemm_reference(dequantize_reference(a).double(), dequantize_reference(b).double(),
                         None if c is None else c.double())
    bound = FP8_GEMM_NT.tolerance.dequantized if out_dtype == torch.float32 else BF16_OUTPUT_BOUND
    return assert_close(d, ref, bound, "d vs dequantized reference")


def _bf16_case(m: int, n: int, k: int, out_dtype: torch.dtype, with_c: bool, seed: int,
               device: torch.device) -> float:
    a = randn(m, k, seed=seed, dtype=torch.bfloat16, device=device)
    b = randn(n, k, seed=seed + 1, dtype=torch.bfloat16, device=device, scale=k ** -0.5)
    c = randn(m, n, seed=seed + 2, device=device) if with_c else None
    d = poison(m, n, dtype=out_dtype, device=device)
    bf16_gemm_nt(a, b, d, c=c)
    assert_written(d, "d")
    ref = gemm_reference(a.double(), b.double(), None if c is None else c.double())
    bound = 1e-6 if out_dtype == torch.float32 else BF16_OUTPUT_BOUND
    return assert_close(d, ref, bound, "d vs reference")


@conformance_cases("fp8_gemm_nt")
def fp8_gemm_cases(quick: bool) -> list[Case]:
    cases = []
    for i, (m, n, k) in enumerate(QUICK_SHAPES if quick else FULL_SHAPES):
        for out_dtype, with_c in ((torch.bfloat16, False), (torch.float32, True)):
            for ue8m0 in (True, False):
                label = f"m={m} n={n} k={k} d={str(out_dtype)[6:]} c={with_c} ue8m0={ue8m0}"
                run = functools.partial(_fp8_case, m, n, k, out_dtype, with_c, ue8m0, 1000 + 10 * i)
                cases.append(Case("fp8_gemm_nt", label, 1000 + 10 * i, run))
    return cases


@conformance_cases("bf16_gemm_nt")
def bf16_gemm_cases(quick: bool) -> list[Case]:
    cases = []
    for i, (m, n, k) in enumerate(QUICK_SHAPES if quick else FULL_SHAPES):
        for out_dtype, with_c in ((torch.bfloat16, False), (torch.float32, True)):
            label = f"m={m} n={n} k={k} d={str(out_dtype)[6:]} c={with_c}"
            run = functools.partial(_bf16_case, m, n, k, out_dtype, with_c, 2000 + 10 * i)
            cases.append(Case("bf16_gemm_nt", label, 2000 + 10 * i, run))
    return cases
