"""The nn / tn / tt GEMMs (DeepGEMM names): the same math as the nt GEMM, with A and/or B given as
their transposes (stored MN-major).

DeepGEMM's two letters say how A and B are stored: A "n" is [M, K] (K contiguous), A "t" is stored
as [K, M]; B "t" is [N, K] (K contiguous), B "n" is stored as [K, N]. So

    fp8_gemm_nn(a, b, d): a (fp8 [M, K], sf [M, ceil(K/128)]),   b (fp8 [K, N], sf [ceil(K/128), ceil(N/128)])
    fp8_gemm_tn(a, b, d): a (fp8 [K, M], sf [ceil(K/128), M]),   b (fp8 [K, N], sf [ceil(K/128), ceil(N/128)])
    fp8_gemm_tt(a, b, d): a (fp8 [K, M], sf [ceil(K/128), M]),   b (fp8 [N, K], sf [ceil(N/128), ceil(K/128)])

and every one computes D = C + A·Bᵀ with A [M, K], B [N, K] — DeepGEMM defines them as calls of the
nt kernel on transposed views, and so does this module: the op binds views `data.mT, scale.mT` of
each transposed operand into the same GemmInputs (so a provider sees A [M, K] and B [N, K]
logically, with MN-major data strides it may exploit), under its own contract, so backends can
register native MN-major kernels. A QuantTensor in a transposed slot is the stored [K, MN] tensor;
a PreparedTensor is always in the nt orientation (prepare the view once:
`prepare_inputs("fp8_gemm_nn", b=(w[0].mT, w[1].mT))`). FP4 operands are not accepted here (their
nibble packing runs along the contiguous axis, so a transpose is not a view).
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, QuantArg, Tolerance, public_op, quant_operand, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from .dense import (GemmInputs, bf16_gemm_nt_kernel, check_bf16_operands, check_fp8_operands, check_gemm_output,
                   fp8_gemm_nt_kernel, gemm_reference)
from ...core.tensors import PreparedTensor, QuantTensor, describe

#: layout -> (A given transposed, B given as [K, N])
LAYOUTS = {"nn": (False, True), "tn": (True, True), "tt": (True, False)}


def _fp8_contract(layout: str) -> OpContract:
    return register_contract(OpContract(
        f"fp8_gemm_{layout}", gemm_reference, Tolerance(dequantized=1e-6, unquantized=1e-3),
        (QuantArg("a", "lhs", (1, 128)), QuantArg("b", "rhs", (128, 128))), fp8_gemm_nt_kernel))


def _bf16_contract(layout: str) -> OpContract:
    return register_contract(OpContract(
        f"bf16_gemm_{layout}", gemm_reference, Tolerance(dequantized=1e-6, unquantized=1e-5), (), bf16_gemm_nt_kernel))


FP8_GEMM_NN, FP8_GEMM_TN, FP8_GEMM_TT = (_fp8_contract(layout) for layout in LAYOUTS)
BF16_GEMM_NN, BF16_GEMM_TN, BF16_GEMM_TT = (_bf16_contract(layout) for layout in LAYOUTS)
FP8_CONTRACTS = {"nn": FP8_GEMM_NN, "tn": FP8_GEMM_TN, "tt": FP8_GEMM_TT}
BF16_CONTRACTS = {"nn": BF16_GEMM_NN, "tn": BF16_GEMM_TN, "tt": BF16_GEMM_TT}


def nt_view(contract: OpContract, arg: str, value: Any, transposed: bool) -> QuantTensor | PreparedTensor:
    """The logical [MN, K] operand of an argument given as stored (transposed: [K, MN]), as views."""
    if not transposed or isinstance(value, PreparedTensor):
        return quant_operand(contract, arg, value)
    if isinstance(value, QuantTensor):
        if value.element != "e4m3":
            raise ContractError(format_problem(contract.name, arg, f"{value.element} data", "fp8 e4m3 data",
                                               "FP4 operands are packed along K: use the nt GEMM"))
        gm, gk = value.granularity
        return QuantTensor.unchecked(value.data.mT, value.scale.mT, (gk, gm), value.ue8m0, value.element)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, torch.Tensor) for v in value):
        return quant_operand(contract, arg, (value[0].mT, value[1].mT))
    return quant_operand(contract, arg, value)  # raises the contract's error for anything else


def _fp8(layout: str, a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None, recipe: Any) -> None:
    contract = FP8_CONTRACTS[layout]
    a_t, b_t = LAYOUTS[layout]
    qa, qb = nt_view(contract, "a", a, a_t), nt_view(contract, "b", b, b_t)
    check_fp8_operands(contract.name, qa, qb, recipe)
    check_gemm_output(contract.name, d, c, (qa.shape[0], qb.shape[0]), qa.device)
    run(contract, GemmInputs(qa, qb, d, c))


def _bf16(layout: str, a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None) -> None:
    contract = BF16_CONTRACTS[layout]
    a_t, b_t = LAYOUTS[layout]
    for arg, t, transposed in (("a", a, a_t), ("b", b, b_t)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            mn = "M" if arg == "a" else "N"
            stored = f"[K, {mn}]" if transposed else f"[{mn}, K]"
            raise ContractError(format_problem(contract.name, arg, describe(t), "a 2-D bfloat16 tensor",
                                               f"pass {arg} stored as {stored}"))
    va, vb = (a.mT if a_t else a), (b.mT if b_t else b)
    check_bf16_operands(contract.name, va, vb, d, c)
    run(contract, GemmInputs(va, vb, d, c))


@public_op(FP8_GEMM_NN)
def fp8_gemm_nn(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None,
                recipe: tuple[int, ...] | None = None) -> None:
    """D = C + A·B with block-scaled FP8 operands: a (fp8 [M, K], fp32 [M, ceil(K/128)]),
    b stored [K, N]: (fp8 [K, N], fp32 [ceil(K/128), ceil(N/128)]); d bf16/fp32 [M, N]."""
    if is_compiling():
        return compiled_call("fp8_gemm_nn", a, b, d, c, recipe)
    _fp8("nn", a, b, d, c, recipe)


@public_op(FP8_GEMM_TN)
def fp8_gemm_tn(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None,
                recipe: tuple[int, ...] | None = None) -> None:
    """D = C + Aᵀ·B: a stored [K, M] (fp8 [K, M], fp32 [ceil(K/128), M]), b stored [K, N]
    (fp8 [K, N], fp32 [ceil(K/128), ceil(N/128)]); d bf16/fp32 [M, N]."""
    if is_compiling():
        return compiled_call("fp8_gemm_tn", a, b, d, c, recipe)
    _fp8("tn", a, b, d, c, recipe)


@public_op(FP8_GEMM_TT)
def fp8_gemm_tt(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None,
                recipe: tuple[int, ...] | None = None) -> None:
    """D = C + Aᵀ·Bᵀ: a stored [K, M] (fp8 [K, M], fp32 [ceil(K/128), M]), b (fp8 [N, K],
    fp32 [ceil(N/128), ceil(K/128)]); d bf16/fp32 [M, N]."""
    if is_compiling():
        return compiled_call("fp8_gemm_tt", a, b, d, c, recipe)
    _fp8("tt", a, b, d, c, recipe)


@public_op(BF16_GEMM_NN)
def bf16_gemm_nn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """D = C + A·B in bf16 (fp32 accumulation): a [M, K], b [K, N], d bf16/fp32 [M, N]."""
    if is_compiling():
        return compiled_call("bf16_gemm_nn", a, b, d, c)
    _bf16("nn", a, b, d, c)


@public_op(BF16_GEMM_TN)
def bf16_gemm_tn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """D = C + Aᵀ·B in bf16 (fp32 accumulation): a [K, M], b [K, N], d bf16/fp32 [M, N]."""
    if is_compiling():
        return compiled_call("bf16_gemm_tn", a, b, d, c)
    _bf16("tn", a, b, d, c)


@public_op(BF16_GEMM_TT)
def bf16_gemm_tt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """D = C + Aᵀ·Bᵀ in bf16 (fp32 accumulation): a [K, M], b [N, K], d bf16/fp32 [M, N]."""
    if is_compiling():
        return compiled_call("bf16_gemm_tt", a, b, d, c)
    _bf16("tt", a, b, d, c)
