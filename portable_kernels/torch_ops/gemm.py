"""Custom ops of the dense GEMMs: fp8_gemm_nt, bf16_gemm_nt, fp8_fp4_gemm_nt.

Each writes `d` in place and returns nothing (`Tensor(d!) d`, as DeepGEMM's calls do); quantized
operands cross as `boundary.OPERAND_FIELDS`. The fakes have nothing to allocate.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops.gemm import fp4
from ..ops.gemm import dense as gemm
from ..core.compiled import ROUTES
from .boundary import OPERAND_ARITY, define, op, operand_args, operand_schema, operands, optional_list

_A, _B = operand_schema("a"), operand_schema("b")


def _nothing(*args: Any) -> None:
    return None


def _recipe(value: list[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


# -- fp8_gemm_nt ----------------------------------------------------------------------------------

def _fp8_gemm_nt_impl(*args: Any) -> None:
    a, b = operands("fp8_gemm_nt", ("a", "b"), args)
    d, c, recipe = args[2 * OPERAND_ARITY:]
    gemm.fp8_gemm_nt(a, b, d, c, _recipe(recipe))


define(f"fp8_gemm_nt({_A}, {_B}, Tensor(d!) d, Tensor? c, int[]? recipe) -> ()",
       _fp8_gemm_nt_impl, _nothing)


def fp8_gemm_nt(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None, recipe: Any = None) -> None:
    contract = gemm.FP8_GEMM_NT
    op("fp8_gemm_nt")(*operand_args(a, contract, "a"), *operand_args(b, contract, "b"), d, c, optional_list(recipe))


# -- bf16_gemm_nt ---------------------------------------------------------------------------------

def _bf16_gemm_nt_impl(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None) -> None:
    gemm.bf16_gemm_nt(a, b, d, c)


define("bf16_gemm_nt(Tensor a, Tensor b, Tensor(d!) d, Tensor? c) -> ()", _bf16_gemm_nt_impl, _nothing)


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    op("bf16_gemm_nt")(a, b, d, c)


# -- fp8_fp4_gemm_nt ------------------------------------------------------------------------------

def _fp8_fp4_gemm_nt_impl(*args: Any) -> None:
    a, b = operands("fp8_fp4_gemm_nt", ("a", "b"), args)
    d, c, recipe, recipe_a, recipe_b = args[2 * OPERAND_ARITY:]
    fp4.fp8_fp4_gemm_nt(a, b, d, c, _recipe(recipe), _recipe(recipe_a), _recipe(recipe_b))


define(f"fp8_fp4_gemm_nt({_A}, {_B}, Tensor(d!) d, Tensor? c, int[]? recipe, int[]? recipe_a, "
       f"int[]? recipe_b) -> ()", _fp8_fp4_gemm_nt_impl, _nothing)


def fp8_fp4_gemm_nt(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None, recipe: Any = None,
                    recipe_a: Any = None, recipe_b: Any = None) -> None:
    contract = fp4.FP8_FP4_GEMM_NT
    op("fp8_fp4_gemm_nt")(*operand_args(a, contract, "a"), *operand_args(b, contract, "b"), d, c,
                          optional_list(recipe), optional_list(recipe_a), optional_list(recipe_b))


ROUTES.update(fp8_gemm_nt=fp8_gemm_nt, bf16_gemm_nt=bf16_gemm_nt, fp8_fp4_gemm_nt=fp8_fp4_gemm_nt)
