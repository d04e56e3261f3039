"""Conformance cases for the nn / tn / tt GEMMs (FP8 and bf16): operands stored the way DeepGEMM's
callers store them (transposed operands contiguous as [K, MN]), each compared with the fp64
reference from the dequantized operands; the prepared-operand path uses the nt views."""

from __future__ import annotations

import functools

import torch

from ..ops.gemm.dense import gemm_reference
from ..ops.gemm.transposed import BF16_CONTRACTS, FP8_CONTRACTS, LAYOUTS, bf16_gemm_nn, bf16_gemm_tn, bf16_gemm_tt, \
    fp8_gemm_nn, fp8_gemm_tn, fp8_gemm_tt
from ..core.prepare import prepare_inputs
from ..ops.quant.fp8 import dequantize_reference, quantize_blocks_reference
from ..core.tensors import QuantTensor
from .checks import assert_close, assert_written
from .core import Case, conformance_cases
from .generators import poison, randn

#: calc_diff bound against the fp64 reference when D is rounded to bf16 (the rounding dominates)
BF16_OUTPUT_BOUND = 1e-5
FP32_OUTPUT_BOUND = 1e-6
QUICK_SHAPES = [(1, 128, 128), (3, 130, 300), (64, 256, 1024), (0, 16, 128)]
FULL_SHAPES = QUICK_SHAPES + [(128, 2048, 7168), (256, 576, 2048)]
FP8_OPS = {"nn": fp8_gemm_nn, "tn": fp8_gemm_tn, "tt": fp8_gemm_tt}
BF16_OPS = {"nn": bf16_gemm_nn, "tn": bf16_gemm_tn, "tt": bf16_gemm_tt}


def _stored(data: torch.Tensor, scale: torch.Tensor | None, transposed: bool):
    """An operand as DeepGEMM's caller stores it: transposed ones contiguous [K, MN]."""
    if not transposed:
        return data if scale is None else (data, scale)
    if scale is None:
        return data.T.contiguous()
    return data.T.contiguous(), scale.T.contiguous()


def _fp8_case(layout: str, m: int, n: int, k: int, out_dtype: torch.dtype, with_c: bool, prepared: bool, seed: int,
              device: torch.device) -> float:
    a_t, b_t = LAYOUTS[layout]
    x = randn(m, k, seed=seed, dtype=torch.bfloat16)
    w = randn(n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
    a = QuantTensor(*quantize_blocks_reference(x, 1, 128, True), (1, 128), True)
    b = QuantTensor(*quantize_blocks_reference(w, 128, 128, True), (128, 128), True)
    c = randn(m, n, seed=seed + 2, device=device) if with_c else None
    d = poison(m, n, dtype=out_dtype, device=device)
    if prepared:  # prepared operands are the nt views of the stored tensors
        views = {}
        for arg, q, transposed in (("a", a, a_t), ("b", b, b_t)):
            data, scale = _stored(q.data.to(device), q.scale.to(device), transposed)
            views[arg] = (data.mT, scale.mT) if transposed else (data, scale)
        ops = prepare_inputs(FP8_CONTRACTS[layout].name, **views)
        FP8_OPS[layout](ops["a"], ops["b"], d, c)
    else:
        FP8_OPS[layout](_stored(a.data.to(device), a.scale.to(device), a_t),
                        _stored(b.data.to(device), b.scale.to(device), b_t), d, c)
    assert_written(d, "d")
    ref = gemm_reference(dequantize_reference(a).double(), dequantize_reference(b).double(),
                         None if c is None else c.cpu().double())
    bound = FP32_OUTPUT_BOUND if out_dtype == torch.float32 else BF16_OUTPUT_BOUND
    return assert_close(d.cpu(), ref, bound, "d vs dequantized reference")


def _bf16_case(layout: str, m: int, n: int, k: int, out_dtype: torch.dtype, with_c: bool, seed: int,
               device: torch.device) -> float:
    a_t, b_t = LAYOUTS[layout]
    a = randn(m, k, seed=seed, dtype=torch.bfloat16, device=device)
    b = randn(n, k, seed=seed + 1, dtype=torch.bfloat16, device=device, scale=k ** -0.5)
    c = randn(m, n, seed=seed + 2, device=device) if with_c else None
    d = poison(m, n, dtype=out_dtype, device=device)
    BF16_OPS[layout](_stored(a, None, a_t), _stored(b, None, b_t), d, c)
    assert_written(d, "d")
    ref = gemm_reference(a.cpu().double(), b.cpu().double(), None if c is None else c.cpu().double())
    bound = FP32_OUTPUT_BOUND if out_dtype == torch.float32 else BF16_OUTPUT_BOUND
    return assert_close(d.cpu(), ref, bound, "d vs reference")


def _cases(layout: str, fp8: bool, quick: bool, seed0: int) -> list[Case]:
    op = (FP8_CONTRACTS if fp8 else BF16_CONTRACTS)[layout].name
    cases = []
    for i, (m, n, k) in enumerate(QUICK_SHAPES if quick else FULL_SHAPES):
        for j, (out_dtype, with_c) in enumerate(((torch.bfloat16, False), (torch.float32, True))):
            seed = seed0 + 10 * i + j
            label = f"m={m} n={n} k={k} d={str(out_dtype)[6:]} c={with_c}"
            if fp8:
                prepared = bool(j)
                run = functools.partial(_fp8_case, layout, m, n, k, out_dtype, with_c, prepared, seed)
                label += f" prepared={prepared}"
            else:
                run = functools.partial(_bf16_case, layout, m, n, k, out_dtype, with_c, seed)
            cases.append(Case(op, label, seed, run))
    return cases


def _register(layout: str, seed0: int) -> None:
    conformance_cases(FP8_CONTRACTS[layout].name)(functools.partial(_cases, layout, True, seed0=seed0))
    conformance_cases(BF16_CONTRACTS[layout].name)(functools.partial(_cases, layout, False, seed0=seed0 + 500))


for _i, _layout in enumerate(LAYOUTS):
    _register(_layout, 7000 + 100 * _i)
