"""The Ascend 950 operand Formats (MX), composed from `fp8_scales` and `nz`.

- `ASCEND_MX`: UE8M0 scales per (1, 32) along K for every operand (weight-block scales broadcast
  along N and replicated along K first, both exact), two K-blocks per int16 (even block in the low
  byte), MN-major, no padding; data ND (DeepGEMM-Ascend keeps dense GEMM operands ND).
- `ASCEND_MX_NZ`: the same scales, data in FRACTAL_NZ tiles — the weights of the grouped (MoE)
  GEMMs, which the fused MoE path and the torch_npu grouped operators prefer.
Powers of two only. Byte diagrams: `fp8_scales` (MX) and `nz` (tiles).
"""

from __future__ import annotations

from typing import Any

import torch

from ._util import ceil_div
from .constants import MX_BLOCK_K
from .format import ELEMENTS, Decoded, Encoded, Format
from .fp8_scales import ascend_mx_decode, ascend_mx_encode_from_blocks
from .nz import nd_to_nz, nz_to_nd


def _mx_scales(operand: Any):
    gm, gk = operand.granularity
    *_, mn, k = operand.shape
    return ascend_mx_encode_from_blocks(operand.scale, mn, k, block_mn=gm, block_k=gk)


def _mx_scale_decode(operand: Any):
    gran = tuple(operand.storage_granularity)
    return ascend_mx_decode(operand.scale, ceil_div(operand.shape[-1], gran[1])), gran


def _encode(operand: Any) -> Encoded:
    return Encoded(operand.data.contiguous(), _mx_scales(operand), (1, MX_BLOCK_K))


def _decode(operand: Any) -> Decoded:
    scale, gran = _mx_scale_decode(operand)
    return Decoded(operand.data, scale, gran)


def _encode_nz(operand: Any) -> Encoded:
    return Encoded(nd_to_nz(operand.data), _mx_scales(operand), (1, MX_BLOCK_K))


def _decode_nz(operand: Any) -> Decoded:
    scale, gran = _mx_scale_decode(operand)
    stored_cols = operand.shape[-1] // 2 if operand.element == "e2m1" else operand.shape[-1]
    return Decoded(nz_to_nd(operand.data, operand.shape[-2], stored_cols), scale, gran)


def _mx_scale_problem(operand: Any) -> str | None:
    if tuple(operand.storage_granularity) != (1, MX_BLOCK_K):
        return f"storage granularity {operand.storage_granularity} is not (1, {MX_BLOCK_K})"
    *lead, mn, k = operand.shape
    words = ceil_div(ceil_div(k, MX_BLOCK_K), ASCEND_BLOCKS_PER_WORD)
    problem = scale_problem(operand, torch.int16, (*lead, mn, words))
    if problem is None and not is_ascend_mx_layout(operand.scale):
        problem = f"scale words have strides {operand.scale.stride()}, not MN-major without padding (ascend_mx_encode)"
    return problem


def _validate(operand: Any) -> str | None:
    return nd_data_problem(operand) or _mx_scale_problem(operand)


def _validate_nz(operand: Any) -> str | None:
    data = operand.data
    *lead, mn, _ = operand.shape
    want = (*lead, *nz_shape(mn, stored_columns(operand), data.dtype))
    if tuple(data.shape) != want:
        return f"data has shape {tuple(data.shape)}, expected the NZ tiles {want}"
    return _mx_scale_problem(operand)


def _mx_granularity(granularity: tuple[int, int]) -> tuple[int, int]:
    return (1, MX_BLOCK_K)


_MX_SCALES = ("int16 [(G,) MN, ceil(K/64)], two UE8M0 exponents per word (even block low), strides (1, MN) "
              "(MN-major, no padding)")
_MX_GRANULARITY = "per (1, 32) along K; weight-block scales broadcast along N and replicated along K"

ASCEND_MX = Format(
    name="ascend-mx-ue8m0-int16-mn-major",
    elements=ELEMENTS,
    scale_storage=_MX_SCALES,
    granularity=_MX_GRANULARITY,
    requires_pow2=True,
    encode=_encode,
    decode=_decode,
    storage_granularity=_mx_granularity,
    validate=_validate,
)

ASCEND_MX_NZ = Format(
    name="ascend-mx-ue8m0-int16-mn-major+nz-data",
    elements=ELEMENTS,
    scale_storage=_MX_SCALES,
    granularity=_MX_GRANULARITY,
    requires_pow2=True,
    encode=_encode_nz,
    decode=_decode_nz,
    storage_granularity=_mx_granularity,
    validate=_validate_nz,
    data_layout="FRACTAL_NZ tiles [(G,) ceil(K/C0), ceil(N/16), 16, C0], C0 = 32 bytes of elements",
)
