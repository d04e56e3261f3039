"""Raw `(data, scale)` operands whose scale is DeepGEMM's packed int32 tensor (UE8M0 exponents,
four K-blocks per word, per row): decoded exactly into the logical QuantTensor.

DeepGEMM hands such tensors around on SM100 (its layout utilities return them MN-major and
TMA-aligned; its casts' `use_packed_ue8m0=True` returns them K-major). They hold exponents only,
so decoding is exact; the op then stores the operand in whatever Format its backend wants
(for nvidia sm100 the same bytes again). The K granularity is not in the tensor: it is taken from
the caller (DeepGEMM's recipe), else the first candidate whose word count matches K.
"""

from __future__ import annotations

from typing import Iterable

import torch

from .errors import ContractError, format_problem
from ..layouts.errors import LayoutConversionError
from ..layouts.fp8_scales import ue8m0_words_to_fp32
from .tensors import QuantTensor, cdiv, describe

PACKED_SCALE_DTYPE = torch.int32
#: K-blocks per int32 word
BLOCKS_PER_WORD = 4


def is_packed_scale(scale: object) -> bool:
    return isinstance(scale, torch.Tensor) and scale.dtype == PACKED_SCALE_DTYPE


def packed_scale_operand(op: str, arg: str, data: torch.Tensor, scale: torch.Tensor, element: str,
                         gran_k_candidates: Iterable[int]) -> QuantTensor:
    """The QuantTensor (granularity (1, gran_k), power-of-two scales) of `data` [..., MN, K or K/2]
    with packed int32 scales [..., MN, ceil(ceil(K/gran_k)/4)] in any strides."""
    k = data.shape[-1] * (2 if element == "e2m1" else 1)
    if scale.dim() != data.dim() or tuple(scale.shape[:-1]) != tuple(data.shape[:-1]):
        raise ContractError(format_problem(
            op, arg, f"packed int32 scale {describe(scale)} for data {describe(data)}",
            "one row of int32 words per row of data ([..., MN, ceil(ceil(K/gran_k)/4)], per-row scales)",
            "pass DeepGEMM's packed scales of this operand, or its fp32 scales"))
    words = scale.shape[-1]
    gran_k = next((g for g in gran_k_candidates if cdiv(cdiv(k, g), BLOCKS_PER_WORD) == words), None)
    if gran_k is None:
        raise ContractError(format_problem(
            op, arg, f"packed int32 scale with {words} words per row for K = {k}",
            f"ceil(ceil(K/gran_k)/4) words with gran_k in {tuple(gran_k_candidates)}",
            "pass the recipe the scales were made with (recipe_a / recipe_b), or fp32 scales"))
    if scale.device != data.device:
        raise ContractError(format_problem(op, arg, f"scale on {scale.device} for data on {data.device}",
                                           "data and scale on one device", "move both to one device"))
    try:
        fp32 = ue8m0_words_to_fp32(scale, cdiv(k, gran_k))
    except LayoutConversionError as exc:
        raise ContractError(format_problem(op, arg, f"packed scale {describe(scale)}", "int32 packed UE8M0 words",
                                           f"pass DeepGEMM's packed scales ({exc})")) from exc
    return QuantTensor.unchecked(data, fp32, (1, gran_k), True, element)
