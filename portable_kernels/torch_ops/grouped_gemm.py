"""Custom ops of the MoE grouped GEMMs (contiguous and masked, FP8 and bf16): each writes `d` in
place (`Tensor(d!) d`) and returns nothing; padding rows are zeroed or keep what `d` held
(ensure_zero_padding), as in eager mode."""

from __future__ import annotations

from typing import Any

import torch

from ..ops.gemm import grouped as gg
from ..core.compiled import ROUTES
from .boundary import OPERAND_ARITY, define, op, operand_args, operand_schema, operands, optional_list

_A, _B = operand_schema("a"), operand_schema("b")


def _nothing(*args: Any) -> None:
    return None


def _recipe(value: list[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


def _fp8_contiguous_impl(*args: Any) -> None:
    a, b = operands("m_grouped_fp8_gemm_nt_contiguous", ("a", "b"), args)
    d, m_indices, recipe, use_psum_layout, expected_m, *rest = args[2 * OPERAND_ARITY:]
    ensure_zero_padding = rest[0] if rest else True
    gg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, _recipe(recipe), use_psum_layout=use_psum_layout,
                                        expected_m_for_psum_layout=expected_m, ensure_zero_padding=ensure_zero_padding)


define(f"m_grouped_fp8_gemm_nt_contiguous({_A}, {_B}, Tensor(d!) d, Tensor m_indices, int[]? recipe, "
       "bool use_psum_layout, int? expected_m_for_psum_layout, bool ensure_zero_padding=True) -> ()", _fp8_contiguous_impl,
       _nothing)


def m_grouped_fp8_gemm_nt_contiguous(a: Any, b: Any, d: torch.Tensor, m_indices: torch.Tensor, recipe: Any = None,
                                     *, use_psum_layout: bool = False,
                                     expected_m_for_psum_layout: int | None = None,
                                     ensure_zero_padding: bool = True) -> None:
    contract = gg.M_GROUPED_FP8_CONTIGUOUS
    op("m_grouped_fp8_gemm_nt_contiguous")(*operand_args(a, contract, "a"), *operand_args(b, contract, "b"), d,
                                           m_indices, optional_list(recipe), use_psum_layout,
                                           expected_m_for_psum_layout, ensure_zero_padding)


def _fp8_masked_impl(*args: Any) -> None:
    a, b = operands("m_grouped_fp8_gemm_nt_masked", ("a", "b"), args)
    d, masked_m, expected_m, recipe = args[2 * OPERAND_ARITY:]
    gg.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, _recipe(recipe))


define(f"m_grouped_fp8_gemm_nt_masked({_A}, {_B}, Tensor(d!) d, Tensor masked_m, int expected_m, int[]? recipe) "
       "-> ()", _fp8_masked_impl, _nothing)


def m_grouped_fp8_gemm_nt_masked(a: Any, b: Any, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                                 recipe: Any = None) -> None:
    contract = gg.M_GROUPED_FP8_MASKED
    op("m_grouped_fp8_gemm_nt_masked")(*operand_args(a, contract, "a"), *operand_args(b, contract, "b"), d, masked_m,
                                       expected_m, optional_list(recipe))


def _bf16_contiguous_impl(a, b, d, m_indices, use_psum_layout, expected_m_for_psum_layout,
                          ensure_zero_padding=True) -> None:
    gg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices, use_psum_layout=use_psum_layout,
                                         expected_m_for_psum_layout=expected_m_for_psum_layout,
                                         ensure_zero_padding=ensure_zero_padding)


define("m_grouped_bf16_gemm_nt_contiguous(Tensor a, Tensor b, Tensor(d!) d, Tensor m_indices, bool use_psum_layout, "
       "int? expected_m_for_psum_layout, bool ensure_zero_padding=True) -> ()", _bf16_contiguous_impl, _nothing)


def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, m_indices: torch.Tensor,
                                      *, use_psum_layout: bool = False,
                                      expected_m_for_psum_layout: int | None = None,
                                      ensure_zero_padding: bool = True) -> None:
    op("m_grouped_bf16_gemm_nt_contiguous")(a, b, d, m_indices, use_psum_layout, expected_m_for_psum_layout,
                                            ensure_zero_padding)


def _bf16_masked_impl(a, b, d, masked_m, expected_m) -> None:
    gg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m)


define("m_grouped_bf16_gemm_nt_masked(Tensor a, Tensor b, Tensor(d!) d, Tensor masked_m, int expected_m) -> ()",
       _bf16_masked_impl, _nothing)


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int) -> None:
    op("m_grouped_bf16_gemm_nt_masked")(a, b, d, masked_m, expected_m)


ROUTES.update(m_grouped_fp8_gemm_nt_contiguous=m_grouped_fp8_gemm_nt_contiguous,
              m_grouped_fp8_gemm_nt_masked=m_grouped_fp8_gemm_nt_masked,
              m_grouped_bf16_gemm_nt_contiguous=m_grouped_bf16_gemm_nt_contiguous,
              m_grouped_bf16_gemm_nt_masked=m_grouped_bf16_gemm_nt_masked)
