"""DeepGEMM's grouped GEMMs with its signatures: m-grouped contiguous (nt, nn) and masked, FP8 x FP8,
FP8 x FP4 and bf16, and the k-grouped weight-gradient GEMMs.

The FP8 m-grouped names are the FP8 x FP4 functions, as in DeepGEMM; FP8 weights go to the semantic
m_grouped_fp8_gemm_*, packed FP4 weights to m_grouped_fp8_fp4_gemm_*. The nn forms take B stored
[G, K, N] and pass its transposed view. Contiguous outputs get their padding rows zeroed unless
ensure_zero_padding=False; the layout's alignment is get_mk_alignment_for_contiguous_layout().

With m_indices (not the psum form) DeepGEMM writes every row of a block it computes, padding rows
(m_indices -1) included, as the GEMM of their A rows, which its layouts zero: so here the padding
rows are always written, as 0, whatever ensure_zero_padding says. Only the psum form leaves its
gaps unwritten when ensure_zero_padding=False, as DeepGEMM does.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops.gemm import grouped_fp4 as pk_fp4
from ..ops.gemm import grouped as pk_grouped
from ..ops.gemm import k_grouped as pk_k
from ._operands import check_keywords, granularities, operand, transposed
from .gemm import _element

__all__ = ["m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous",
           "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous",
           "m_grouped_fp8_gemm_nt_masked", "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous",
           "m_grouped_bf16_gemm_nt_masked", "k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous",
           "k_grouped_bf16_gemm_tn_contiguous", "fp8_m_grouped_gemm_nt_masked", "bf16_m_grouped_gemm_nt_masked"]


def _operands(op: str, a: Any, b: Any, recipe: Any, recipe_a: Any, recipe_b: Any, compiled_dims: Any,
              disable_ue8m0_cast: Any, b_transposed: bool) -> tuple[Any, Any]:
    check_keywords(op, compiled_dims, disable_ue8m0_cast)
    ga, gb = granularities(op, recipe, recipe_a, recipe_b)
    qb = operand(op, "b", transposed(op, "b", b) if b_transposed else b, gb)
    return operand(op, "a", a, ga), qb


def _zero_padding(use_psum_layout: Any, ensure_zero_padding: Any) -> Any:
    """DeepGEMM writes m_indices padding rows (the GEMM of zeroed A rows: 0) even without
    ensure_zero_padding; only its psum gaps stay unwritten then."""
    return True if use_psum_layout is False and ensure_zero_padding is False else ensure_zero_padding


def _contiguous(op: str, a: Any, b: Any, d: torch.Tensor, grouped_layout: torch.Tensor, recipe: Any, recipe_a: Any,
                recipe_b: Any, compiled_dims: Any, disable_ue8m0_cast: Any, use_psum_layout: Any,
                ensure_zero_padding: Any, expected_m: Any, b_transposed: bool) -> None:
    ensure_zero_padding = _zero_padding(use_psum_layout, ensure_zero_padding)
    qa, qb = _operands(op, a, b, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast, b_transposed)
    fn = pk_fp4.m_grouped_fp8_fp4_gemm_nt_contiguous if _element(qb) == "e2m1" \
        else pk_grouped.m_grouped_fp8_gemm_nt_contiguous
    fn(qa, qb, d, grouped_layout, use_psum_layout=use_psum_layout, expected_m_for_psum_layout=expected_m,
       ensure_zero_padding=ensure_zero_padding)


def m_grouped_fp8_fp4_gemm_nt_contiguous(a: Any, b: Any, d: torch.Tensor, grouped_layout: torch.Tensor,
                                         recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None,
                                         compiled_dims: str = "nk", disable_ue8m0_cast: bool = False,
                                         use_psum_layout: bool = False, ensure_zero_padding: bool = True,
                                         expected_m_for_psum_layout: int | None = None) -> None:
    """D[r] = A[r]·B[g]ᵀ per row of group g: a (fp8 [M, K], sf), b (fp8 or packed FP4 [G, N, K(/2)], sf),
    grouped_layout int32 m_indices [M] (or psum [G] with use_psum_layout)."""
    _contiguous("m_grouped_fp8_fp4_gemm_nt_contiguous", a, b, d, grouped_layout, recipe, recipe_a, recipe_b,
                compiled_dims, disable_ue8m0_cast, use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout,
                False)


def m_grouped_fp8_fp4_gemm_nn_contiguous(a: Any, b: Any, d: torch.Tensor, grouped_layout: torch.Tensor,
                                         recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None,
                                         compiled_dims: str = "nk", disable_ue8m0_cast: bool = False,
                                         use_psum_layout: bool = False, ensure_zero_padding: bool = True) -> None:
    """As the nt form with b stored [G, K, N] (fp8, scales [G, ceil(K/128), ceil(N/128)])."""
    _contiguous("m_grouped_fp8_fp4_gemm_nn_contiguous", a, b, d, grouped_layout, recipe, recipe_a, recipe_b,
                compiled_dims, disable_ue8m0_cast, use_psum_layout, ensure_zero_padding, None, True)


def m_grouped_fp8_fp4_gemm_nt_masked(a: Any, b: Any, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                                     recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None,
                                     compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> None:
    """D[g, r] = A[g, r]·B[g]ᵀ for r < masked_m[g]: a (fp8 [G, max_m, K], sf), b (fp8 or FP4 [G, N, K(/2)], sf)."""
    op = "m_grouped_fp8_fp4_gemm_nt_masked"
    qa, qb = _operands(op, a, b, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast, False)
    fn = pk_fp4.m_grouped_fp8_fp4_gemm_nt_masked if _element(qb) == "e2m1" else pk_grouped.m_grouped_fp8_gemm_nt_masked
    fn(qa, qb, d, masked_m, expected_m)


m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp8_gemm_nn_contiguous = m_grouped_fp8_fp4_gemm_nn_contiguous
m_grouped_fp8_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked  # DeepGEMM's legacy alias


def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, grouped_layout: torch.Tensor,
                                      compiled_dims: str = "nk", use_psum_layout: bool = False,
                                      ensure_zero_padding: bool = True,
                                      expected_m_for_psum_layout: int | None = None) -> None:
    """bf16 contiguous grouped GEMM: a [M, K], b [G, N, K], d [M, N]."""
    check_keywords("m_grouped_bf16_gemm_nt_contiguous", compiled_dims)
    pk_grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, use_psum_layout=use_psum_layout,
                                                 expected_m_for_psum_layout=expected_m_for_psum_layout,
                                                 ensure_zero_padding=_zero_padding(use_psum_layout,
                                                                                   ensure_zero_padding))


def m_grouped_bf16_gemm_nn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, grouped_layout: torch.Tensor,
                                      compiled_dims: str = "nk", use_psum_layout: bool = False,
                                      ensure_zero_padding: bool = True) -> None:
    """bf16 contiguous grouped GEMM with b stored [G, K, N]."""
    check_keywords("m_grouped_bf16_gemm_nn_contiguous", compiled_dims)
    # B stored [G, K, N]: its nt form is the transposed view (a provider that needs K-contiguous rows copies it)
    pk_grouped.m_grouped_bf16_gemm_nt_contiguous(a, b.mT if isinstance(b, torch.Tensor) else b, d, grouped_layout,
                                                 use_psum_layout=use_psum_layout,
                                                 ensure_zero_padding=_zero_padding(use_psum_layout,
                                                                                   ensure_zero_padding))


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int, compiled_dims: str = "nk") -> None:
    """bf16 masked grouped GEMM: a [G, max_m, K], b [G, N, K], d [G, max_m, N]."""
    check_keywords("m_grouped_bf16_gemm_nt_masked", compiled_dims)
    pk_grouped.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m)


bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked  # DeepGEMM's legacy alias


def k_grouped_fp8_gemm_tn_contiguous(a: Any, b: Any, d: torch.Tensor, ks_cpu: list[int] | None,
                                     grouped_layout: torch.Tensor, c: torch.Tensor | None = None,
                                     recipe: tuple = (1, 1, 128), compiled_dims: str = "mn",
                                     use_psum_layout: bool = False) -> None:
    """d[g] = c[g] + A_gᵀ·B_g: a (fp8 [sum_K, M], fp32 [sum_kb, M]), b likewise, d fp32 [G, M, N]."""
    check_keywords("k_grouped_fp8_gemm_tn_contiguous", compiled_dims)
    pk_k.k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c, recipe, use_psum_layout=use_psum_layout)


def k_grouped_fp8_gemm_nt_contiguous(a: Any, b: Any, d: torch.Tensor, ks_cpu: list[int] | None,
                                     grouped_layout: torch.Tensor, c: torch.Tensor | None = None,
                                     recipe: tuple = (1, 1, 128), compiled_dims: str = "mn",
                                     use_psum_layout: bool = False) -> None:
    """d[g] = c[g] + A_g·B_gᵀ: a (flat fp8 [sum_K * M], fp32 [M, sum_kb]), b likewise (no psum form)."""
    check_keywords("k_grouped_fp8_gemm_nt_contiguous", compiled_dims)
    pk_k.k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks_cpu, grouped_layout, c, recipe, use_psum_layout=use_psum_layout)


def k_grouped_bf16_gemm_tn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ks_cpu: list[int] | None,
                                      grouped_layout: torch.Tensor, c: torch.Tensor | None = None,
                                      compiled_dims: str = "mn", use_psum_layout: bool = False) -> None:
    """d[g] = c[g] + A_gᵀ·B_g in bf16 (fp32 accumulation): a [sum_K, M], b [sum_K, N], d fp32 [G, M, N]."""
    check_keywords("k_grouped_bf16_gemm_tn_contiguous", compiled_dims)
    pk_k.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c, use_psum_layout=use_psum_layout)
