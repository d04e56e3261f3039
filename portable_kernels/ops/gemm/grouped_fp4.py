"""Grouped MoE GEMMs with FP8 activations and FP4 (E2M1) weights (DeepGEMM names and argument order).

`m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, m_indices, recipe=None, recipe_a=None, recipe_b=None,
*, use_psum_layout=False, expected_m_for_psum_layout=None, ensure_zero_padding=True)` and
`m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None,
recipe_b=None)`: the grouped GEMMs of grouped.py with b = per_token_cast_to_fp4 of each
expert's weight (packed [G, N, K/2], scales per (1, 32) or (1, 128)). Same layouts, same padding
and alignment rules; the reference kernels are the grouped ones (they dequantize either element).
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.compiled import compiled_call, is_compiling
from ...core.contract import (
    OpContract,
    QuantArg,
    Tolerance,
    public_op,
    quant_operand,
    register_contract,
)
from ...core.errors import ContractError, format_problem
from .fp4 import FP8_FP4_GRAN_K, check_recipes, fp4_operand
from .dense import check_gemm_output
from .grouped import (
    check_grouped_shapes,
    grouped_gemm_contiguous_reference,
    grouped_gemm_masked_reference,
    m_grouped_gemm_nt_contiguous_kernel,
    m_grouped_gemm_nt_masked_kernel,
    run_contiguous,
    run_masked,
)
from ...layouts.constants import MX_BLOCK_K
from ...core.tensors import PreparedTensor, QuantTensor

M_GROUPED_FP8_FP4_CONTIGUOUS = register_contract(OpContract(
    "m_grouped_fp8_fp4_gemm_nt_contiguous", grouped_gemm_contiguous_reference,
    Tolerance(dequantized=1e-6, unquantized=1e-2),
    (QuantArg("a", "lhs", (1, 128)), QuantArg("b", "rhs", (1, MX_BLOCK_K))), m_grouped_gemm_nt_contiguous_kernel))
M_GROUPED_FP8_FP4_MASKED = register_contract(OpContract(
    "m_grouped_fp8_fp4_gemm_nt_masked", grouped_gemm_masked_reference, Tolerance(dequantized=1e-6, unquantized=1e-2),
    (QuantArg("a", "lhs", (1, 128)), QuantArg("b", "rhs", (1, MX_BLOCK_K))), m_grouped_gemm_nt_masked_kernel))


def _operands(contract: OpContract, a: Any, b: Any, recipe: Any, recipe_a: Any, recipe_b: Any,
              masked: bool) -> tuple[QuantTensor | PreparedTensor, QuantTensor | PreparedTensor]:
    op = contract.name
    qa = quant_operand(contract, "a", a)
    qb = fp4_operand(contract, "b", b, dims=3)
    for arg, t, element, fix in (("a", qa, "e4m3", "quantize activations with per_token_cast_to_fp8"),
                                 ("b", qb, "e2m1", ("quantize each expert's weight with per_token_cast_to_fp4, or "
                                                    "use m_grouped_fp8_gemm_nt_* for FP8 weights"))):
        if t.element != element:
            raise ContractError(format_problem(op, arg, f"{t.element} data", f"{element} data", fix))
        g = tuple(t.granularity)
        if g[0] != 1 or g[1] not in FP8_FP4_GRAN_K:
            raise ContractError(format_problem(op, arg, f"scaled per {g}",
                                               f"per-row scales (1, gran_k) with gran_k in {FP8_FP4_GRAN_K}",
                                               "quantize per token (per_token_cast_to_fp8 / per_token_cast_to_fp4)"))
    check_grouped_shapes(op, tuple(qa.shape), tuple(qb.shape), masked)
    if qb.device != qa.device:
        raise ContractError(format_problem(op, "b", f"on {qb.device}", f"on {qa.device} like a", "move b to a's device"))
    check_recipes(op, qa, qb, recipe, recipe_a, recipe_b)
    return qa, qb


@public_op(M_GROUPED_FP8_FP4_CONTIGUOUS)
def m_grouped_fp8_fp4_gemm_nt_contiguous(a: Any, b: Any, d: torch.Tensor, m_indices: torch.Tensor,
                                         recipe: tuple[int, ...] | None = None, recipe_a: tuple[int, ...] | None = None,
                                         recipe_b: tuple[int, ...] | None = None, *,
                                         use_psum_layout: bool = False, expected_m_for_psum_layout: int | None = None,
                                         ensure_zero_padding: bool = True) -> None:
    """MoE grouped GEMM, contiguous layout, FP8 activations x FP4 weights, written into d.

    a: (fp8 [M, K], fp32 [M, ceil(K/gran_k)]), gran_k 128 or 32
    b: (int8/uint8 [G, N, K/2] packed E2M1, fp32 [G, N, ceil(K/32)]) — per_token_cast_to_fp4 of each
       expert (gran_k 32 or 128); prepare it once with prepare_inputs
    d, m_indices, use_psum_layout, expected_m_for_psum_layout, ensure_zero_padding: as in
       m_grouped_fp8_gemm_nt_contiguous; recipe / recipe_a / recipe_b: as in fp8_fp4_gemm_nt
    """
    if is_compiling():
        return compiled_call("m_grouped_fp8_fp4_gemm_nt_contiguous", a, b, d, m_indices, recipe, recipe_a, recipe_b,
                             use_psum_layout=use_psum_layout, expected_m_for_psum_layout=expected_m_for_psum_layout,
                             ensure_zero_padding=ensure_zero_padding)
    contract = M_GROUPED_FP8_FP4_CONTIGUOUS
    qa, qb = _operands(contract, a, b, recipe, recipe_a, recipe_b, masked=False)
    check_gemm_output(contract.name, d, None, (qa.shape[0], qb.shape[1]), qa.device)
    run_contiguous(contract, qa, qb, d, m_indices, use_psum_layout, expected_m_for_psum_layout, ensure_zero_padding)


@public_op(M_GROUPED_FP8_FP4_MASKED)
def m_grouped_fp8_fp4_gemm_nt_masked(a: Any, b: Any, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                                     recipe: tuple[int, ...] | None = None, recipe_a: tuple[int, ...] | None = None,
                                     recipe_b: tuple[int, ...] | None = None) -> None:
    """MoE grouped GEMM, masked layout, FP8 activations x FP4 weights, written into d.

    a: (fp8 [G, max_m, K], fp32 [G, max_m, ceil(K/gran_k)]); b: (packed E2M1 [G, N, K/2],
    fp32 [G, N, ceil(K/32)]); d, masked_m, expected_m: as in m_grouped_fp8_gemm_nt_masked (rows >=
    masked_m[g] untouched); recipe / recipe_a / recipe_b: as in fp8_fp4_gemm_nt
    """
    if is_compiling():
        return compiled_call("m_grouped_fp8_fp4_gemm_nt_masked", a, b, d, masked_m, expected_m, recipe, recipe_a,
                             recipe_b)
    qa, qb = _operands(M_GROUPED_FP8_FP4_MASKED, a, b, recipe, recipe_a, recipe_b, masked=True)
    run_masked(M_GROUPED_FP8_FP4_MASKED, qa, qb, d, masked_m, expected_m)
