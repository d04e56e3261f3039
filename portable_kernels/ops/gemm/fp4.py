"""The FP8xFP4 dense GEMM (DeepGEMM name): `fp8_fp4_gemm_nt(a, b, d, c=None, recipe=None,
recipe_a=None, recipe_b=None)`: D = C + A·Bᵀ with an FP8 per-token A and an FP4 per-(1, 32) B.

`fp4_operand` reads a raw DeepGEMM FP4 tuple (also for the grouped FP8xFP4 GEMMs).
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, QuantArg, Tolerance, public_op, quant_operand, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.packed_scales import is_packed_scale, packed_scale_operand
from ...core.tensors import PreparedTensor, QuantTensor, cdiv, describe
from ...layouts.constants import MX_BLOCK_K
from .dense import GemmInputs, check_gemm_output, check_shared_k, fp8_gemm_nt_kernel, gemm_reference

#: dtypes DeepGEMM-style raw FP4 tuples may carry their packed bytes in
PACKED_FP4_DTYPES = (torch.uint8, torch.int8, torch.float4_e2m1fn_x2)
#: K granularities of per-token scales the FP8×FP4 GEMM takes (DeepGEMM: 32 or 128)
FP8_FP4_GRAN_K = (MX_BLOCK_K, 128)

FP8_FP4_GEMM_NT = register_contract(OpContract(
    "fp8_fp4_gemm_nt", gemm_reference, Tolerance(dequantized=1e-6, unquantized=1e-2),
    # b is the weight operand ("rhs"); its scales are per row (1, 32), as DeepGEMM's mixed recipes
    (QuantArg("a", "lhs", (1, 128)), QuantArg("b", "rhs", (1, MX_BLOCK_K))), fp8_gemm_nt_kernel))


def fp4_operand(contract: OpContract, arg: str, value: Any, dims: int = 2) -> QuantTensor | PreparedTensor:
    """The logical view of an FP4 argument; a raw DeepGEMM tuple (packed int8/uint8 [(G,) N, K/2],
    fp32 [(G,) N, ceil(K/gran_k)] or DeepGEMM's packed int32 UE8M0 scales) becomes a QuantTensor with
    element "e2m1" and gran_k read off the shapes; `dims` is 2, or 3 for grouped weights."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, torch.Tensor) for v in value)
            and value[0].dtype in PACKED_FP4_DTYPES):
        return quant_operand(contract, arg, value)
    data, scale = value
    if is_packed_scale(scale) and data.dim() == dims:
        return packed_scale_operand(contract.name, arg, data.view(torch.uint8), scale, "e2m1", (MX_BLOCK_K, 128))
    if data.dim() != dims or scale.dtype != torch.float32 or scale.dim() != dims \
            or tuple(scale.shape[:-1]) != tuple(data.shape[:-1]):
        lead = "[G, N, " if dims == 3 else "[N, "
        raise ContractError(format_problem(contract.name, arg, f"scale {describe(scale)} for data {describe(data)}",
                                           f"fp32 scales {lead}ceil(K/gran_k)] for packed data {lead}K/2]",
                                           "pass the logical fp32 scales of per_token_cast_to_fp4"))
    k = data.shape[-1] * 2
    gran_k = next((g for g in FP8_FP4_GRAN_K if cdiv(k, g) == scale.shape[-1]), None)
    if gran_k is None:
        raise ContractError(format_problem(contract.name, arg, f"scale of shape {tuple(scale.shape)} for K = {k}",
                                           f"ceil(K/gran_k) columns with gran_k in {FP8_FP4_GRAN_K}",
                                           "quantize with per_token_cast_to_fp4(w, gran_k=32)"))
    return QuantTensor(data.view(torch.uint8), scale, (1, gran_k), element="e2m1")


def check_recipes(op: str, a: QuantTensor | PreparedTensor, b: QuantTensor | PreparedTensor, recipe: Any,
                   recipe_a: Any, recipe_b: Any) -> None:
    ga, gb = tuple(a.granularity), tuple(b.granularity)
    if recipe is not None:
        if not (isinstance(recipe, (tuple, list)) and len(recipe) == 3) or ga[1] != gb[1] \
                or tuple(recipe) != (ga[0], gb[0], ga[1]):
            raise ContractError(format_problem(op, "recipe", repr(recipe),
                                               f"None (the operands' granularities a {ga}, b {gb})",
                                               "leave recipe=None, or assert each operand with recipe_a / recipe_b"))
    for arg, value, g in (("recipe_a", recipe_a, ga), ("recipe_b", recipe_b, gb)):
        if value is not None and (not isinstance(value, (tuple, list)) or tuple(value) != g):
            raise ContractError(format_problem(op, arg, repr(value), f"None or {g} (the operand's granularity)",
                                               "leave it None or quantize with the matching gran_k"))


def _check_fp8_fp4_operands(op: str, a: QuantTensor | PreparedTensor, b: QuantTensor | PreparedTensor) -> None:
    for arg, t, element, fix in (("a", a, "e4m3", "quantize with per_token_cast_to_fp8 (use fp4 only for b)"),
                                 ("b", b, "e2m1", "quantize with per_token_cast_to_fp4, or use fp8_gemm_nt")):
        if t.element != element:
            raise ContractError(format_problem(op, arg, f"{t.element} data", f"{element} data", fix))
        if len(t.shape) != 2:
            raise ContractError(format_problem(op, arg, f"of logical shape {tuple(t.shape)}", "2-D [rows, K]",
                                               "pass one matrix; the grouped FP4 GEMMs are not provided"))
        g = tuple(t.granularity)
        if g[0] != 1 or g[1] not in FP8_FP4_GRAN_K:
            raise ContractError(format_problem(op, arg, f"scaled per {g}",
                                               f"per-row scales (1, gran_k) with gran_k in {FP8_FP4_GRAN_K}",
                                               "quantize per token (per_token_cast_to_fp8 / per_token_cast_to_fp4)"))
    check_shared_k(op, a.shape, b.shape)
    if b.device != a.device:
        raise ContractError(format_problem(op, "b", f"on {b.device}", f"on {a.device} like a", "move b to a's device"))


@public_op(FP8_FP4_GEMM_NT)
def fp8_fp4_gemm_nt(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None,
                    recipe: tuple[int, ...] | None = None,
                    recipe_a: tuple[int, ...] | None = None, recipe_b: tuple[int, ...] | None = None) -> None:
    """D = C + A·Bᵀ with an FP8 activation and an FP4 weight, written into d.

    a: (fp8 [M, K], fp32 [M, ceil(K/128)]) — per-token FP8 (gran_k 128 or 32); a tuple, QuantTensor
       or PreparedTensor
    b: (uint8/int8 [N, K/2] packed E2M1, fp32 [N, ceil(K/32)]) — per_token_cast_to_fp4 output
       (gran_k 32 or 128); prepare weights once with prepare_inputs
    d: bf16 or fp32 [M, N], row-major; c: None or fp32 (or d's dtype) [M, N]
    recipe: must stay None unless both operands share one gran_k; recipe_a / recipe_b: None or the
       operand's (1, gran_k), asserted (DeepGEMM's mixed-precision recipes)
    """
    if is_compiling():
        return compiled_call("fp8_fp4_gemm_nt", a, b, d, c, recipe, recipe_a, recipe_b)
    op = FP8_FP4_GEMM_NT.name
    qa = quant_operand(FP8_FP4_GEMM_NT, "a", a)
    qb = fp4_operand(FP8_FP4_GEMM_NT, "b", b)
    _check_fp8_fp4_operands(op, qa, qb)
    check_recipes(op, qa, qb, recipe, recipe_a, recipe_b)
    check_gemm_output(op, d, c, (qa.shape[0], qb.shape[0]), qa.device)
    run(FP8_FP4_GEMM_NT, GemmInputs(qa, qb, d, c))
