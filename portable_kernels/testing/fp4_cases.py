"""Conformance cases for the FP4 family (per_token_cast_to_fp4, fp8_fp4_gemm_nt) and the fused
swiglu_forward_and_per_token_cast: quantizers byte-exact (FP4) or tight (fused) against the
contract's reference math, the GEMM against fp64 references from dequantized operands."""

from __future__ import annotations

import functools

import torch

from ..ops.quant.fp4 import PER_TOKEN_CAST_FP4, per_token_cast_to_fp4, quantize_fp4_reference
from ..ops.gemm.fp4 import FP8_FP4_GEMM_NT, fp8_fp4_gemm_nt
from ..ops.swiglu import SWIGLU_CAST, swiglu_forward_and_per_token_cast, swiglu_forward_and_per_token_cast_reference, swiglu_reference, swiglu_rows
from ..ops.gemm.dense import gemm_reference
from ..layouts.constants import MX_BLOCK_K
from ..core.prepare import prepare_inputs
from ..ops.quant.fp8 import dequantize_reference, quantize_blocks_reference
from ..core.tensors import QuantTensor
from .checks import assert_close, assert_quantization_matches, assert_written
from .core import Case, CaseFailure, conformance_cases
from .generators import generator, poison, randn

#: calc_diff bound against the fp64 reference when D is rounded to bf16 (the rounding dominates)
BF16_OUTPUT_BOUND = 1e-5

QUICK_CAST_SHAPES = [(1, 32), (3, 300), (64, 1024), (2, 5, 64)]
FULL_CAST_SHAPES = QUICK_CAST_SHAPES + [(256, 7168), (2048, 2048)]
QUICK_GEMM_SHAPES = [(1, 128, 128), (7, 130, 320), (64, 256, 1024), (0, 32, 64)]
FULL_GEMM_SHAPES = QUICK_GEMM_SHAPES + [(128, 2048, 7168), (256, 576, 2048)]
# (M, I, num_per_channels, weighted, with padding rows, clamp)
QUICK_SWIGLU = [(16, 256, 128, False, False, None), (33, 128, 128, True, True, 0.5), (4, 96, 96, False, True, 10.0)]
FULL_SWIGLU = QUICK_SWIGLU + [(512, 2048, 128, True, True, 10.0), (256, 7168, 7168, True, False, None)]


def _cast_case(shape, gran_k: int, ue8m0: bool, convention: str, seed: int, device: torch.device) -> float:
    x = randn(*shape, seed=seed, dtype=torch.bfloat16, device=device, scale=3.0)
    q = per_token_cast_to_fp4(x, gran_k=gran_k, use_ue8m0=ue8m0, convention=convention)
    want_data, want_scale = quantize_fp4_reference(x.cpu(), gran_k, ue8m0, convention)
    if q.element != "e2m1" or tuple(q.granularity) != (1, gran_k):
        raise CaseFailure(f"result is {q!r}; expected an e2m1 QuantTensor with granularity (1, {gran_k})")
    want = QuantTensor(want_data, want_scale, (1, gran_k), ue8m0, element="e2m1")
    if convention == "portable":
        assert_quantization_matches(q, want, exact_scales=ue8m0)
    elif not (torch.equal(q.data.cpu(), want.data) and torch.equal(q.scale.cpu(), want.scale)):
        raise CaseFailure(f"convention {convention!r} promises its library's bytes: "
                          f"{int((q.data.cpu() != want.data).sum())} bytes differ")
    return assert_close(dequantize_reference(q), x.float(), PER_TOKEN_CAST_FP4.tolerance.unquantized,
                        "dequantized vs input")


def _gemm_case(m: int, n: int, k: int, gran_k_a: int, out_dtype: torch.dtype, with_c: bool, seed: int,
               device: torch.device) -> float:
    x = randn(m, k, seed=seed, dtype=torch.bfloat16, device=device)
    w = randn(n, k, seed=seed + 1, dtype=torch.bfloat16, device=device, scale=k ** -0.5)
    # operands from the reference quantizers, so the case checks the GEMM alone
    a = QuantTensor(*(t.to(device) for t in quantize_blocks_reference(x.cpu(), 1, gran_k_a, True)), (1, gran_k_a),
                    ue8m0=True)
    b = QuantTensor(*(t.to(device) for t in quantize_fp4_reference(w.cpu(), MX_BLOCK_K, True)), (1, MX_BLOCK_K),
                    ue8m0=True, element="e2m1")
    prepared = prepare_inputs(fp8_fp4_gemm_nt, a=a, b=b)
    c = randn(m, n, seed=seed + 2, device=device) if with_c else None
    d = poison(m, n, dtype=out_dtype, device=device)
    fp8_fp4_gemm_nt(prepared["a"], prepared["b"], d, c=c)
    assert_written(d, "d")
    ref = gemm_reference(dequantize_reference(a).cpu().double(), dequantize_reference(b).cpu().double(),
                         None if c is None else c.cpu().double())
    bound = FP8_FP4_GEMM_NT.tolerance.dequantized if out_dtype == torch.float32 else BF16_OUTPUT_BOUND
    diff = assert_close(d, ref, bound, "d vs dequantized reference")
    if m and n:
        exact = x.cpu().double() @ w.cpu().double().T + (0 if c is None else c.cpu().double())
        assert_close(d, exact, FP8_FP4_GEMM_NT.tolerance.unquantized, "d vs unquantized product")
    return diff


def _swiglu_inputs(m: int, inter: int, weighted: bool, padded: bool, seed: int, device: torch.device):
    x = randn(m, 2 * inter, seed=seed, dtype=torch.bfloat16, device=device, scale=2.0)
    gen = generator(seed + 1)
    pos_to_expert = torch.randint(0, 8, (m,), generator=gen, dtype=torch.int32)
    if padded:
        pos_to_expert[torch.rand(m, generator=gen) < 0.25] = -1
    topk = 2
    tokens = max(1, m // topk)
    pos_to_token_topk = torch.randint(0, tokens * topk, (m,), generator=gen, dtype=torch.int32)
    pos_to_token_topk[pos_to_expert < 0] = -1
    topk_weights = torch.rand(tokens, topk, generator=gen)
    mapping = dict(pos_to_expert=pos_to_expert.to(device) if padded else None,
                   pos_to_token_topk=pos_to_token_topk.to(device) if weighted else None,
                   topk_weights=topk_weights.to(device) if weighted else None)
    return x, mapping


def _swiglu_case(m: int, inter: int, per: int, weighted: bool, padded: bool, clamp, round_sf: bool, seed: int,
                 device: torch.device) -> float:
    x, mapping = _swiglu_inputs(m, inter, weighted, padded, seed, device)
    q = swiglu_forward_and_per_token_cast(x, "e4m3", per, round_sf=round_sf, swiglu_clamp_value=clamp, **mapping)
    if tuple(q.shape) != (m, inter) or tuple(q.granularity) != (1, per):
        raise CaseFailure(f"result is {q!r}; expected fp8 [{m}, {inter}] with granularity (1, {per})")
    cpu_map = {key: (None if v is None else v.cpu()) for key, v in mapping.items()}
    want = QuantTensor(*swiglu_forward_and_per_token_cast_reference(x.cpu(), per, round_sf, swiglu_clamp_value=clamp,
                                                                    **cpu_map), (1, per))
    got = dequantize_reference(q).cpu()
    diff = assert_close(got, dequantize_reference(want), SWIGLU_CAST.tolerance.dequantized,
                        "dequantized vs reference quantization")
    valid, weight = swiglu_rows(m, cpu_map["pos_to_token_topk"], cpu_map["topk_weights"], cpu_map["pos_to_expert"],
                                torch.device("cpu"))
    if bool((got[~valid] != 0).any()):
        raise CaseFailure("padding rows are not zero")
    exact = swiglu_reference(x.cpu().double(), weight, clamp)
    assert_close(got[valid], exact[valid], SWIGLU_CAST.tolerance.unquantized, "dequantized vs fp64 swiglu")
    return diff


@conformance_cases("per_token_cast_to_fp4")
def fp4_cast_cases(quick: bool) -> list[Case]:
    cases = []
    for i, shape in enumerate(QUICK_CAST_SHAPES if quick else FULL_CAST_SHAPES):
        for gran_k, ue8m0, convention in ((32, True, "portable"), (32, False, "portable"), (128, True, "portable"),
                                          (32, True, "deep_gemm"), (128, False, "deep_gemm")):
            seed = 6000 + 10 * i
            label = f"shape={shape} gran_k={gran_k} ue8m0={ue8m0} convention={convention}"
            cases.append(Case("per_token_cast_to_fp4", label, seed,
                              functools.partial(_cast_case, shape, gran_k, ue8m0, convention, seed)))
    return cases


@conformance_cases("fp8_fp4_gemm_nt")
def fp8_fp4_gemm_cases(quick: bool) -> list[Case]:
    cases = []
    for i, (m, n, k) in enumerate(QUICK_GEMM_SHAPES if quick else FULL_GEMM_SHAPES):
        for gran_k_a, out_dtype, with_c in ((128, torch.bfloat16, False), (32, torch.float32, True)):
            seed = 6100 + 10 * i
            label = f"m={m} n={n} k={k} gran_k_a={gran_k_a} d={str(out_dtype)[6:]} c={with_c}"
            cases.append(Case("fp8_fp4_gemm_nt", label, seed,
                              functools.partial(_gemm_case, m, n, k, gran_k_a, out_dtype, with_c, seed)))
    return cases


@conformance_cases("swiglu_forward_and_per_token_cast")
def swiglu_cases(quick: bool) -> list[Case]:
    cases = []
    for i, (m, inter, per, weighted, padded, clamp) in enumerate(QUICK_SWIGLU if quick else FULL_SWIGLU):
        for round_sf in (False, True):
            seed = 6200 + 10 * i
            label = (f"m={m} I={inter} per={per} weighted={weighted} padded={padded} clamp={clamp} "
                     f"round_sf={round_sf}")
            cases.append(Case("swiglu_forward_and_per_token_cast", label, seed,
                              functools.partial(_swiglu_case, m, inter, per, weighted, padded, clamp, round_sf, seed)))
    return cases
