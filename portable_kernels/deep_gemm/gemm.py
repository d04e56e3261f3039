"""DeepGEMM's dense GEMMs with its signatures: fp8_fp4_gemm_{nt,nn,tn,tt} (fp8_gemm_* are the same
functions, as in DeepGEMM), bf16_gemm_{nt,nn,tn,tt}, and cublaslt_gemm_* (bf16 operands).

Each reads DeepGEMM's operands and keywords (see _operands) and calls one semantic op: FP8 x FP8 ->
fp8_gemm_<layout>, FP8 x FP4 (nt) -> fp8_fp4_gemm_nt. Not provided: FP4 activations (a packed FP4),
and FP4 operands in the nn/tn/tt layouts (DeepGEMM stores those packed along MN).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..ops.gemm import dense as pk_gemm
from ..ops.gemm import transposed as pk_t
from ..core.errors import ContractError, format_problem
from ..ops.gemm.fp4 import fp8_fp4_gemm_nt as pk_fp8_fp4_gemm_nt
# DeepGEMM's hyper-connection prenorm GEMM: the portable op has its signature and defaults as they are
from ..ops.gemm.hc_prenorm import tf32_hc_prenorm_gemm
from ..core.tensors import PreparedTensor, QuantTensor, describe
from ._operands import PACKED_FP4, check_keywords, granularities, k_major_fp4, operand, stored, transposed

__all__ = ["fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt", "fp8_gemm_nt", "fp8_gemm_nn",
           "fp8_gemm_tn", "fp8_gemm_tt", "bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt",
           "cublaslt_gemm_nt", "cublaslt_gemm_nn", "cublaslt_gemm_tn", "cublaslt_gemm_tt", "fp8_gemm_nt_skip_head_mid",
           "tf32_hc_prenorm_gemm"]

#: layout -> (A stored transposed, B stored as [K, N])
LAYOUTS = {"nt": (False, False), "nn": (False, True), "tn": (True, True), "tt": (True, False)}
_FP8_OPS: dict[str, Callable[..., None]] = {"nt": pk_gemm.fp8_gemm_nt, "nn": pk_t.fp8_gemm_nn, "tn": pk_t.fp8_gemm_tn,
                                            "tt": pk_t.fp8_gemm_tt}
_BF16_OPS: dict[str, Callable[..., None]] = {"nt": pk_gemm.bf16_gemm_nt, "nn": pk_t.bf16_gemm_nn,
                                             "tn": pk_t.bf16_gemm_tn, "tt": pk_t.bf16_gemm_tt}


def _element(value: Any) -> str:
    if isinstance(value, (QuantTensor, PreparedTensor)):
        return value.element
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return "e2m1" if value[0].dtype in PACKED_FP4 else "e4m3"
    return "e4m3"


def _bind(op: str, arg: str, value: Any, granularity: tuple | None, is_transposed: bool) -> Any:
    """The operand in the form the semantic op of this layout takes (stored form for transposed slots)."""
    if not is_transposed:
        return operand(op, arg, value, granularity)
    return stored(operand(op, arg, transposed(op, arg, value), granularity))


def _fp8_fp4(layout: str, a: Any, b: Any, d: torch.Tensor, c: Any, recipe: Any, recipe_a: Any, recipe_b: Any,
             compiled_dims: Any, disable_ue8m0_cast: Any) -> None:
    op = f"fp8_fp4_gemm_{layout}"
    check_keywords(op, compiled_dims, disable_ue8m0_cast)
    if _element(a) == "e2m1":
        raise ContractError(format_problem(op, "a", "packed FP4 data", "FP8 activations (FP4 x FP8 / FP4 x FP4 "
                                           "GEMMs are not provided)", "quantize a with per_token_cast_to_fp8"))
    ga, gb = granularities(op, recipe, recipe_a, recipe_b)
    a_t, b_t = LAYOUTS[layout]
    if layout == "nt":
        b = k_major_fp4(b)  # DeepGEMM's SM100 nt also takes FP4 B packed along N (MN-major)
    qa, qb = _bind(op, "a", a, ga, a_t), _bind(op, "b", b, gb, b_t)
    if _element(qb) == "e2m1":
        if layout != "nt":
            raise ContractError(format_problem(op, "b", "packed FP4 data in the nn/tn/tt layout",
                                               "the nt layout for FP4 weights", "call fp8_fp4_gemm_nt"))
        pk_fp8_fp4_gemm_nt(qa, qb, d, c)
        return
    _FP8_OPS[layout](qa, qb, d, c)


def fp8_fp4_gemm_nt(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None, recipe: Any = None,
                    recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "nk",
                    disable_ue8m0_cast: bool = False) -> None:
    """D = C + A·Bᵀ: a (fp8 [M, K], sf), b (fp8 or packed FP4 [N, K(/2)], sf); d bf16/fp32 [M, N]."""
    _fp8_fp4("nt", a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


def fp8_fp4_gemm_nn(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None, recipe: Any = None,
                    recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "nk",
                    disable_ue8m0_cast: bool = False) -> None:
    """D = C + A·B: a (fp8 [M, K], sf), b stored [K, N] (fp8, sf [.., N]-major)."""
    _fp8_fp4("nn", a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


def fp8_fp4_gemm_tn(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None, recipe: Any = None,
                    recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "mn",
                    disable_ue8m0_cast: bool = False) -> None:
    """D = C + Aᵀ·B: a stored [K, M], b stored [K, N] (fp8 with their transposed scales)."""
    _fp8_fp4("tn", a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


def fp8_fp4_gemm_tt(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None, recipe: Any = None,
                    recipe_a: Any = None, recipe_b: Any = None, compiled_dims: str = "mn",
                    disable_ue8m0_cast: bool = False) -> None:
    """D = C + Aᵀ·Bᵀ: a stored [K, M] (fp8, transposed scales), b (fp8 [N, K], sf)."""
    _fp8_fp4("tt", a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


# DeepGEMM binds these names to the same functions
fp8_gemm_nt, fp8_gemm_nn, fp8_gemm_tn, fp8_gemm_tt = fp8_fp4_gemm_nt, fp8_fp4_gemm_nn, fp8_fp4_gemm_tn, fp8_fp4_gemm_tt


def _bf16(layout: str, a: Any, b: Any, d: torch.Tensor, c: Any, compiled_dims: Any) -> None:
    check_keywords(f"bf16_gemm_{layout}", compiled_dims)
    _BF16_OPS[layout](a, b, d, c)


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
                 compiled_dims: str = "nk") -> None:
    """D = C + A·Bᵀ in bf16: a [M, K], b [N, K]."""
    _bf16("nt", a, b, d, c, compiled_dims)


def bf16_gemm_nn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
                 compiled_dims: str = "nk") -> None:
    """D = C + A·B in bf16: a [M, K], b [K, N]."""
    _bf16("nn", a, b, d, c, compiled_dims)


def bf16_gemm_tn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
                 compiled_dims: str = "mn") -> None:
    """D = C + Aᵀ·B in bf16: a [K, M], b [K, N]."""
    _bf16("tn", a, b, d, c, compiled_dims)


def bf16_gemm_tt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
                 compiled_dims: str = "mn") -> None:
    """D = C + Aᵀ·Bᵀ in bf16: a [K, M], b [N, K]."""
    _bf16("tt", a, b, d, c, compiled_dims)


def _cublaslt(layout: str, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: Any) -> None:
    op = f"cublaslt_gemm_{layout}"
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
            raise ContractError(format_problem(op, arg, describe(t), "a bf16 tensor (cuBLASLt's FP8 path without "
                                               "scales is a benchmark peer, not provided)", "pass bf16 operands"))
    _BF16_OPS[layout](a, b, d, c)


def cublaslt_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    _cublaslt("nt", a, b, d, c)


def cublaslt_gemm_nn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    _cublaslt("nn", a, b, d, c)


def cublaslt_gemm_tn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    _cublaslt("tn", a, b, d, c)


def cublaslt_gemm_tt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    _cublaslt("tt", a, b, d, c)


def _rows(value: Any) -> int | None:
    """N of an nt B operand: a (data, sf) pair, a QuantTensor or a PreparedTensor (logical shape)."""
    if isinstance(value, PreparedTensor):
        return int(value.shape[-2])
    if isinstance(value, QuantTensor):
        return int(value.data.shape[-2])
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor) and value[0].dim() == 2:
        return int(value[0].shape[0])
    return None


def fp8_gemm_nt_skip_head_mid(a: Any, b: Any, d: torch.Tensor, head_splits: tuple[int, int, int],
                              recipe: Any = None, compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> None:
    """DeepGEMM's `fp8_gemm_nt_skip_head_mid`: A·Bᵀ (B [N, K], N = heads·(left + right)) written into
    d [M, heads·(left + mid + right)] per head as [left | mid untouched | right]. Differs: the FP8
    GEMM runs into a temporary [M, N] that two copies place into d (DeepGEMM's epilogue writes in place)."""
    op = "fp8_gemm_nt_skip_head_mid"
    if not (isinstance(head_splits, (tuple, list)) and len(head_splits) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in head_splits)
            and head_splits[0] + head_splits[2] > 0):
        raise ContractError(format_problem(op, "head_splits", repr(head_splits), "(left, mid, right) non-negative "
                                           "ints with left + right > 0", "pass e.g. (128, 64, 128)"))
    left, mid, right = head_splits
    n = _rows(b)
    if not isinstance(d, torch.Tensor) or d.dim() != 2 or not d.is_contiguous() or n is None:
        raise ContractError(format_problem(op, "d", describe(d), "a contiguous [M, heads · (left + mid + right)] "
                                           "output and an nt B operand [N, K]", "allocate d row-major"))
    if n % (left + right) or d.shape[1] != n + n // (left + right) * mid:
        raise ContractError(format_problem(op, "d", describe(d), f"[M, {n + n // (left + right) * mid if n % (left + right) == 0 else '?'}]"
                                           f" for N = {n} and head_splits {tuple(head_splits)}",
                                           "pass N a multiple of left + right and d with the mid columns per head"))
    heads = n // (left + right)
    out = torch.empty(d.shape[0], n, dtype=d.dtype, device=d.device)
    fp8_fp4_gemm_nt(a, b, out, recipe=recipe, compiled_dims=compiled_dims, disable_ue8m0_cast=disable_ue8m0_cast)
    placed, computed = d.view(d.shape[0], heads, left + mid + right), out.view(d.shape[0], heads, left + right)
    placed[:, :, :left] = computed[:, :, :left]
    placed[:, :, left + mid:] = computed[:, :, left:]
