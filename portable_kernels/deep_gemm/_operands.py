"""How the deep_gemm module reads DeepGEMM's operands and GEMM keywords before calling the semantic ops.

- recipe / recipe_a / recipe_b name each operand's block granularity (DeepGEMM: either `recipe`
  (gran_m, gran_n, gran_k) or the pair recipe_a (gran_m, gran_k) + recipe_b (gran_n, gran_k); none:
  read off the scale shapes). A raw pair is bound at that granularity.
- packed FP4 data (int8 / uint8 / float4_e2m1fn_x2) makes an "e2m1" operand; int32 scales are
  DeepGEMM's packed UE8M0 words, decoded exactly (portable_kernels.core.packed_scales).
- compiled_dims and disable_ue8m0_cast are checked and otherwise have no effect: compiled_dims only
  picks what DeepGEMM's JIT specializes on, and this library never rounds a scale silently (a
  non-power-of-two scale where only exponents are stored is refused), so there is no cast to disable.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.checks import check_bool
from ..core.errors import ContractError, format_problem
from ..core.packed_scales import is_packed_scale, packed_scale_operand
from ..core.tensors import PreparedTensor, QuantTensor, describe
from ..layouts import pack_e2m1, unpack_e2m1

PACKED_FP4 = (torch.int8, torch.uint8, torch.float4_e2m1fn_x2)
#: the dims DeepGEMM's JIT may specialize a kernel on
COMPILED_DIMS = frozenset("mnk")


def check_keywords(op: str, compiled_dims: Any, disable_ue8m0_cast: Any = False) -> None:
    if not isinstance(compiled_dims, str) or not set(compiled_dims) <= COMPILED_DIMS \
            or len(set(compiled_dims)) != len(compiled_dims):
        raise ContractError(format_problem(op, "compiled_dims", repr(compiled_dims), "a string of the letters m, n, k",
                                           "pass e.g. 'nk' (DeepGEMM's default) or 'mn'"))
    check_bool(op, "disable_ue8m0_cast", disable_ue8m0_cast)


def granularities(op: str, recipe: Any, recipe_a: Any, recipe_b: Any) -> tuple[tuple | None, tuple | None]:
    """(granularity of a, granularity of b) from DeepGEMM's recipe keywords, None where unstated."""
    if recipe is not None and (recipe_a is not None or recipe_b is not None):
        raise ContractError(format_problem(op, "recipe", repr(recipe), "either recipe or recipe_a + recipe_b",
                                           "pass one form (DeepGEMM accepts only one)"))
    if (recipe_a is None) != (recipe_b is None):
        raise ContractError(format_problem(op, "recipe_a" if recipe_a is None else "recipe_b", "None",
                                           "recipe_a and recipe_b together", "pass both operand recipes"))
    if recipe is not None:
        if not (isinstance(recipe, (tuple, list)) and len(recipe) == 3 and all(isinstance(v, int) for v in recipe)):
            raise ContractError(format_problem(op, "recipe", repr(recipe), "(gran_m, gran_n, gran_k)",
                                               "pass e.g. (1, 128, 128)"))
        return (recipe[0], recipe[2]), (recipe[1], recipe[2])
    for arg, value in (("recipe_a", recipe_a), ("recipe_b", recipe_b)):
        if value is not None and not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise ContractError(format_problem(op, arg, repr(value), "(gran_mn, gran_k)", "pass e.g. (1, 32)"))
    return (None if recipe_a is None else tuple(recipe_a)), (None if recipe_b is None else tuple(recipe_b))


def operand(op: str, arg: str, value: Any, granularity: tuple | None) -> Any:
    """The operand the semantic op takes: a QuantTensor bound at the recipe's granularity, or the value as
    given (prepared tensors, QuantTensors and pairs without a recipe: the op reads them itself)."""
    if isinstance(value, (QuantTensor, PreparedTensor)):
        if granularity is not None and tuple(value.granularity) != tuple(granularity):
            raise ContractError(format_problem(op, arg, f"quantized per {tuple(value.granularity)}",
                                               f"the recipe's {tuple(granularity)}", "pass the matching recipe"))
        return value
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, torch.Tensor) for v in value)):
        return value  # the semantic op names what is wrong
    data, scale = value
    element = "e2m1" if data.dtype in PACKED_FP4 else "e4m3"
    if element == "e2m1":
        data = data.view(torch.uint8)
    if is_packed_scale(scale):
        candidates = (granularity[1],) if granularity is not None else ((32, 128) if element == "e2m1" else (128, 32))
        if granularity is not None and granularity[0] != 1:
            raise ContractError(format_problem(op, arg, f"packed int32 scales with recipe {granularity}",
                                               "a per-row recipe (1, gran_k): packed scales are per row",
                                               "pass recipe (1, 1, gran_k) / recipe_b=(1, gran_k)"))
        return packed_scale_operand(op, arg, data, scale, element, candidates)
    if granularity is None:
        return value
    if scale.dtype != torch.float32:
        raise ContractError(format_problem(op, arg, f"scale {describe(scale)}", "fp32 or packed int32 scales",
                                           "pass the scales of DeepGEMM's casts"))
    return QuantTensor(data, scale, tuple(granularity), element=element)


def transposed(op: str, arg: str, value: Any) -> Any:
    """The nt view of an operand DeepGEMM's nn/tn/tt or grouped nn forms take transposed (FP4 refused:
    its packing runs along the stored rows, so the transpose is not a view)."""
    if isinstance(value, QuantTensor) or (isinstance(value, (tuple, list)) and len(value) == 2
                                          and isinstance(value[0], torch.Tensor)):
        data = value[0]
        if data.dtype in PACKED_FP4:
            raise ContractError(format_problem(op, arg, "packed FP4 data stored MN-major",
                                               "FP4 operands stored K-major (the nt form)",
                                               "call the nt function with the K-major FP4 operand (repack with "
                                               "transpose_packed_fp4)"))
        if isinstance(value, QuantTensor):
            gm, gk = value.granularity
            return QuantTensor.unchecked(value.data.mT, value.scale.mT, (gk, gm), value.ue8m0, value.element)
        return value[0].mT, value[1].mT
    return value


def k_major_fp4(value: Any) -> Any:
    """An nt operand's FP4 data given MN-major (DeepGEMM's `transpose_packed_fp4(x).T` view: [MN/2, K]
    with stride(0) == 1, packed along MN) repacked K-major [MN, K/2] — a copy on every call, so keep
    FP4 weights K-major to avoid it. Anything else is returned as given."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], torch.Tensor)):
        return value
    data, scale = value
    if data.dtype not in PACKED_FP4 or data.dim() != 2 or data.stride(-1) == 1 or data.stride(0) != 1:
        return value
    codes = unpack_e2m1(data.T.contiguous().view(torch.uint8))        # [K, MN] element codes
    return pack_e2m1(codes.T.contiguous()).view(data.dtype), scale


def stored(value: Any) -> Any:
    """The inverse of `transposed` for what `operand` returns: an nt operand back in its stored form."""
    if isinstance(value, QuantTensor):
        gm, gk = value.granularity
        return QuantTensor.unchecked(value.data.mT, value.scale.mT, (gk, gm), value.ue8m0, value.element)
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], torch.Tensor):
        return value[0].mT, value[1].mT
    return value
