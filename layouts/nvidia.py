"""The NVIDIA operand Formats: SM90 (Hopper) and SM100 (Blackwell), composed from `fp8_scales`.

- `SM90`: fp32 scales; per-row scales (activations, DeepGEMM's SFA) MN-major and TMA-aligned,
  128x128 weight-block scales (SFB) as is, K-major. Any fp32 scale.
- `SM100`: every scale per row (128x128 weight scales broadcast along N first, exact), UE8M0
  exponents packed four K-blocks per int32, MN-major, TMA-aligned. Powers of two only.
Data bytes (fp8 e4m3, or packed e2m1) stay ND and K-major on both. The byte diagrams are in
`fp8_scales` (worked example M = 3, K = 512).
"""

from __future__ import annotations

from typing import Any

import torch

from ._util import ceil_div
from .format import ELEMENTS, Decoded, Encoded, Format, block_scale_shape, nd_data_problem, scale_problem
from .constants import SM100_BLOCKS_PER_WORD
from .fp8_scales import (is_sm90_sfa_layout, is_sm100_ue8m0_layout, sm90_sfa_decode, sm90_sfa_encode, sm90_sfb_decode,
                         sm90_sfb_encode, sm100_ue8m0_decode, sm100_ue8m0_encode_from_blocks)


def _sm90_encode(operand: Any) -> Encoded:
    gran = tuple(operand.granularity)
    scale = sm90_sfa_encode(operand.scale) if gran[0] == 1 else sm90_sfb_encode(operand.scale)
    return Encoded(operand.data.contiguous(), scale, gran)


def _sm90_decode(operand: Any) -> Decoded:
    gran = tuple(operand.storage_granularity)
    scale = sm90_sfa_decode(operand.scale) if gran[0] == 1 else sm90_sfb_decode(operand.scale)
    return Decoded(operand.data, scale, gran)


def _sm100_encode(operand: Any) -> Encoded:
    gm, gk = operand.granularity  # block scales are replicated to one per row while packing (exact)
    return Encoded(operand.data.contiguous(), sm100_ue8m0_encode_from_blocks(operand.scale, operand.shape[-2], gm),
                   (1, gk))


def _sm100_decode(operand: Any) -> Decoded:
    gran = tuple(operand.storage_granularity)
    return Decoded(operand.data, sm100_ue8m0_decode(operand.scale, ceil_div(operand.shape[-1], gran[1])), gran)


def _sm90_validate(operand: Any) -> str | None:
    problem = nd_data_problem(operand) or scale_problem(operand, torch.float32, block_scale_shape(operand))
    if problem is None:
        per_row = operand.storage_granularity[0] == 1
        if per_row and not is_sm90_sfa_layout(operand.scale):
            problem = f"per-row scales have strides {operand.scale.stride()}, not MN-major TMA-aligned (sm90_sfa_encode)"
        elif not per_row and not operand.scale.is_contiguous():
            problem = f"block scales have strides {operand.scale.stride()}, expected contiguous (K-major)"
    return problem


def _sm100_validate(operand: Any) -> str | None:
    gm, gk = operand.storage_granularity
    if gm != 1:
        return f"storage granularity {operand.storage_granularity} is not per row (1, gran_k)"
    *lead, mn, k = operand.shape
    words = ceil_div(ceil_div(k, gk), SM100_BLOCKS_PER_WORD)
    problem = nd_data_problem(operand) or scale_problem(operand, torch.int32, (*lead, mn, words))
    if problem is None and not is_sm100_ue8m0_layout(operand.scale):
        problem = f"scale words have strides {operand.scale.stride()}, not MN-major TMA-aligned (sm100_ue8m0_encode)"
    return problem


def _same(granularity: tuple[int, int]) -> tuple[int, int]:
    return tuple(granularity)


def _per_row(granularity: tuple[int, int]) -> tuple[int, int]:
    return (1, granularity[1])


SM90 = Format(
    name="sm90-fp32-mn-major-tma",
    elements=ELEMENTS,
    scale_storage="fp32; per-row scales [(G,) MN, sf_k] with strides (1, align(MN, 4)) (MN-major, TMA-aligned); "
                  "block scales [(G,) ceil(N/128), sf_k] contiguous (K-major)",
    granularity="as quantized: (1, gran_k) activations, (128, 128) weights",
    requires_pow2=False,
    encode=_sm90_encode,
    decode=_sm90_decode,
    storage_granularity=_same,
    validate=_sm90_validate,
)

SM100 = Format(
    name="sm100-ue8m0-int32-mn-major-tma",
    elements=ELEMENTS,
    scale_storage="int32 [(G,) MN, ceil(sf_k/4)], four UE8M0 exponents per word (little-endian), strides "
                  "(1, align(MN, 4)) (MN-major, TMA-aligned)",
    granularity="per row (1, gran_k); weight-block scales broadcast along N",
    requires_pow2=True,
    encode=_sm100_encode,
    decode=_sm100_decode,
    storage_granularity=_per_row,
    validate=_sm100_validate,
)
