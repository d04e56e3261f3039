"""Custom ops of the ops added for drop-in parity (issue 11): the nn / tn / tt GEMMs, the grouped
FP8 x FP4 GEMMs, the K-grouped GEMMs, sparse MLA prefill and varlen attention.

The GEMMs write `d` in place and return nothing (quantized operands cross as
`boundary.OPERAND_FIELDS`, transposed operands in the form the caller stores them); the K-grouped
operands are plain (data, scale) tensor pairs; the attention ops return fresh tensors whose fakes
follow from the sizes.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops.attention import prefill as attention
from ..ops.gemm import transposed as gemm_transposed, grouped_fp4, k_grouped as k_grouped_gemm
from ..core.compiled import ROUTES
from .boundary import OPERAND_ARITY, define, fresh, op, operand_args, operand_schema, operands, optional_list

_A, _B = operand_schema("a"), operand_schema("b")


def _nothing(*args: Any) -> None:
    return None


def _recipe(value: list[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


# -- fp8_gemm_{nn,tn,tt}, bf16_gemm_{nn,tn,tt} ---------------------------------------------------

def _fp8_transposed(layout: str) -> None:
    name = f"fp8_gemm_{layout}"
    public = getattr(gemm_transposed, name)
    contract = gemm_transposed.FP8_CONTRACTS[layout]

    def impl(*args: Any) -> None:
        a, b = operands(name, ("a", "b"), args)
        d, c, recipe = args[2 * OPERAND_ARITY:]
        public(a, b, d, c, _recipe(recipe))

    define(f"{name}({_A}, {_B}, Tensor(d!) d, Tensor? c, int[]? recipe) -> ()", impl, _nothing)

    def route(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None, recipe: Any = None) -> None:
        op(name)(*operand_args(a, contract, "a"), *operand_args(b, contract, "b"), d, c, optional_list(recipe))

    ROUTES[name] = route


def _bf16_transposed(layout: str) -> None:
    name = f"bf16_gemm_{layout}"
    public = getattr(gemm_transposed, name)

    def impl(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None) -> None:
        public(a, b, d, c)

    define(f"{name}(Tensor a, Tensor b, Tensor(d!) d, Tensor? c) -> ()", impl, _nothing)

    def route(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
        op(name)(a, b, d, c)

    ROUTES[name] = route


for _layout in gemm_transposed.LAYOUTS:
    _fp8_transposed(_layout)
    _bf16_transposed(_layout)


# -- m_grouped_fp8_fp4_gemm_nt_{contiguous,masked} -----------------------------------------------

def _fp4_contiguous_impl(*args: Any) -> None:
    a, b = operands("m_grouped_fp8_fp4_gemm_nt_contiguous", ("a", "b"), args)
    d, m_indices, recipe, recipe_a, recipe_b, use_psum_layout, expected_m, zero = args[2 * OPERAND_ARITY:]
    grouped_fp4.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, m_indices, _recipe(recipe), _recipe(recipe_a),
                                                     _recipe(recipe_b), use_psum_layout=use_psum_layout,
                                                     expected_m_for_psum_layout=expected_m, ensure_zero_padding=zero)


define(f"m_grouped_fp8_fp4_gemm_nt_contiguous({_A}, {_B}, Tensor(d!) d, Tensor m_indices, int[]? recipe, "
       "int[]? recipe_a, int[]? recipe_b, bool use_psum_layout, int? expected_m_for_psum_layout, "
       "bool ensure_zero_padding) -> ()", _fp4_contiguous_impl, _nothing)


def m_grouped_fp8_fp4_gemm_nt_contiguous(a: Any, b: Any, d: torch.Tensor, m_indices: torch.Tensor,
                                         recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None, *,
                                         use_psum_layout: bool = False, expected_m_for_psum_layout: int | None = None,
                                         ensure_zero_padding: bool = True) -> None:
    contract = grouped_fp4.M_GROUPED_FP8_FP4_CONTIGUOUS
    op("m_grouped_fp8_fp4_gemm_nt_contiguous")(
        *operand_args(a, contract, "a"), *operand_args(b, contract, "b"), d, m_indices, optional_list(recipe),
        optional_list(recipe_a), optional_list(recipe_b), use_psum_layout, expected_m_for_psum_layout,
        ensure_zero_padding)


def _fp4_masked_impl(*args: Any) -> None:
    a, b = operands("m_grouped_fp8_fp4_gemm_nt_masked", ("a", "b"), args)
    d, masked_m, expected_m, recipe, recipe_a, recipe_b = args[2 * OPERAND_ARITY:]
    grouped_fp4.m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m, _recipe(recipe), _recipe(recipe_a),
                                                 _recipe(recipe_b))


define(f"m_grouped_fp8_fp4_gemm_nt_masked({_A}, {_B}, Tensor(d!) d, Tensor masked_m, int expected_m, int[]? recipe, "
       "int[]? recipe_a, int[]? recipe_b) -> ()", _fp4_masked_impl, _nothing)


def m_grouped_fp8_fp4_gemm_nt_masked(a: Any, b: Any, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                                     recipe: Any = None, recipe_a: Any = None, recipe_b: Any = None) -> None:
    contract = grouped_fp4.M_GROUPED_FP8_FP4_MASKED
    op("m_grouped_fp8_fp4_gemm_nt_masked")(*operand_args(a, contract, "a"), *operand_args(b, contract, "b"), d,
                                           masked_m, expected_m, optional_list(recipe), optional_list(recipe_a),
                                           optional_list(recipe_b))


# -- k-grouped GEMMs (plain operands) -------------------------------------------------------------

def _pair(value: Any) -> tuple[Any, Any]:
    """A k-grouped FP8 operand's (data, scale); anything else crosses as (value, None) and the op
    names what is wrong."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value[0], value[1]
    return value, None


def _k_fp8_impl(name: str):
    public = getattr(k_grouped_gemm, name)

    def impl(a_data, a_scale, b_data, b_scale, d, ks_cpu, grouped_layout, c, recipe, use_psum_layout) -> None:
        public((a_data, a_scale), (b_data, b_scale), d, ks_cpu, grouped_layout, c, tuple(recipe),
               use_psum_layout=use_psum_layout)
    return impl


for _name in ("k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous"):
    define(f"{_name}(Tensor a_data, Tensor a_scale, Tensor b_data, Tensor b_scale, Tensor(d!) d, int[]? ks_cpu, "
           "Tensor grouped_layout, Tensor? c, int[] recipe, bool use_psum_layout) -> ()", _k_fp8_impl(_name), _nothing)


def k_grouped_fp8_gemm_tn_contiguous(a: Any, b: Any, d: torch.Tensor, ks_cpu: list[int] | None,
                                     grouped_layout: torch.Tensor, c: torch.Tensor | None = None,
                                     recipe: tuple[int, int, int] = (1, 1, 128), *,
                                     use_psum_layout: bool = False) -> None:
    op("k_grouped_fp8_gemm_tn_contiguous")(*_pair(a), *_pair(b), d, ks_cpu, grouped_layout, c, list(recipe),
                                           use_psum_layout)


def k_grouped_fp8_gemm_nt_contiguous(a: Any, b: Any, d: torch.Tensor, ks_cpu: list[int],
                                     grouped_layout: torch.Tensor, c: torch.Tensor | None = None,
                                     recipe: tuple[int, int, int] = (1, 1, 128), *,
                                     use_psum_layout: bool = False) -> None:
    op("k_grouped_fp8_gemm_nt_contiguous")(*_pair(a), *_pair(b), d, ks_cpu, grouped_layout, c, list(recipe),
                                           use_psum_layout)


def _k_bf16_impl(a, b, d, ks_cpu, grouped_layout, c, use_psum_layout) -> None:
    k_grouped_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c,
                                                     use_psum_layout=use_psum_layout)


define("k_grouped_bf16_gemm_tn_contiguous(Tensor a, Tensor b, Tensor(d!) d, int[]? ks_cpu, Tensor grouped_layout, "
       "Tensor? c, bool use_psum_layout) -> ()", _k_bf16_impl, _nothing)


def k_grouped_bf16_gemm_tn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ks_cpu: list[int] | None,
                                      grouped_layout: torch.Tensor, c: torch.Tensor | None = None, *,
                                      use_psum_layout: bool = False) -> None:
    op("k_grouped_bf16_gemm_tn_contiguous")(a, b, d, ks_cpu, grouped_layout, c, use_psum_layout)


# -- prefill attention ----------------------------------------------------------------------------

def _sparse_impl(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    return fresh(attention.flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length), q, kv)


def _sparse_fake(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    s_q, h_q = q.shape[:2]
    return (q.new_empty((s_q, h_q, d_v)), q.new_empty((s_q, h_q), dtype=torch.float32),
            q.new_empty((s_q, h_q), dtype=torch.float32))


define("flash_mla_sparse_fwd(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v, Tensor? attn_sink, "
       "Tensor? topk_length) -> (Tensor out, Tensor max_logits, Tensor lse)", _sparse_impl, _sparse_fake)


def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
                         attn_sink: torch.Tensor | None = None,
                         topk_length: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return op("flash_mla_sparse_fwd")(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)


def _varlen_impl(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, dropout_p, softmax_scale,
                 causal, deterministic, is_varlen):
    return fresh(attention.flash_attn_varlen_func(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv,
                                                  dropout_p, softmax_scale, causal, deterministic, is_varlen), q, k, v)


def _varlen_fake(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, dropout_p, softmax_scale,
                 causal, deterministic, is_varlen):
    total_q, h_q = q.shape[:2]
    return q.new_empty((total_q, h_q, v.shape[-1])), q.new_empty((total_q, h_q), dtype=torch.float32)


define("flash_attn_varlen_func(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_qo, Tensor cu_seqlens_kv, "
       "int max_seqlen_qo, int max_seqlen_kv, float dropout_p, float? softmax_scale, bool causal, bool deterministic, "
       "bool is_varlen) -> (Tensor out, Tensor lse)", _varlen_impl, _varlen_fake)


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_qo: torch.Tensor,
                           cu_seqlens_kv: torch.Tensor, max_seqlen_qo: int, max_seqlen_kv: int, dropout_p: float = 0.0,
                           softmax_scale: float | None = None, causal: bool = False, deterministic: bool = False,
                           is_varlen: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    return op("flash_attn_varlen_func")(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, dropout_p,
                                        softmax_scale, causal, deterministic, is_varlen)


ROUTES.update(m_grouped_fp8_fp4_gemm_nt_contiguous=m_grouped_fp8_fp4_gemm_nt_contiguous,
              m_grouped_fp8_fp4_gemm_nt_masked=m_grouped_fp8_fp4_gemm_nt_masked,
              k_grouped_fp8_gemm_tn_contiguous=k_grouped_fp8_gemm_tn_contiguous,
              k_grouped_fp8_gemm_nt_contiguous=k_grouped_fp8_gemm_nt_contiguous,
              k_grouped_bf16_gemm_tn_contiguous=k_grouped_bf16_gemm_tn_contiguous,
              flash_mla_sparse_fwd=flash_mla_sparse_fwd, flash_attn_varlen_func=flash_attn_varlen_func)
