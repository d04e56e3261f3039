"""The Ascend operand Formats, composed from `fp8_scales` and `nz` (docs/ascend.md, *Byte formats*).

Ascend 950 (MX, powers of two only):
- `ASCEND_MX_KMAJOR`: UE8M0 scales per (1, 32) along K as K-major pairs, float8_e8m0fnu
  `[(G,) MN, ceil(K/64), 2]`, contiguous; data ND. This is what CANN's MX quant matmul and grouped
  matmul take for K-major data (x1 `(m, ceil(k/64), 2)`; a weight stored `(n, k)` takes
  `(n, ceil(k/64), 2)`), and what `npu_dynamic_mx_quant(axis=-1)` emits. The torch_npu providers read it.
- `ASCEND_MX`: the same exponents two per int16, MN-major, no padding (bytes `[ceil(K/64), MN, 2]`):
  CANN's form for MN-major data (x2 stored `(k, n)`); with our K-major data CANN's rule that data and
  scale share their transposition rules it out for torch_npu. Kept for kernels that read MN-major scales.
- `ASCEND_MX_NZ`: `ASCEND_MX` scales with FRACTAL_NZ data tiles (for Ascend C kernels; torch_npu
  builds its NZ weights itself with `npu_format_cast(x, 29)` from ND data).

Atlas A2/A3 (no FP8 datatypes): weights are stored dequantized, once at ingest.
- `ASCEND_BF16_VALUES`: the values `data x scale` in bf16 — exact because the scales are powers of
  two (an e4m3 value has 4 significant bits, bf16 8). 2 bytes per element.
- `ASCEND_FP32_VALUES`: the same in fp32, for arbitrary fp32 scales (exact). 4 bytes per element.
Both keep the fp32 block scales beside the values, so decoding returns the original e4m3 codes.
"""

from __future__ import annotations

from typing import Any

import torch

from ._util import ceil_div
from .constants import ASCEND_BLOCKS_PER_WORD, MX_BLOCK_K
from .errors import LayoutConversionError
from .format import (ELEMENTS, Decoded, Encoded, Format, block_scale_shape, nd_data_problem, scale_problem,
                     stored_columns)
from .fp8_scales import (ascend_mx_decode, ascend_mx_encode_from_blocks, ascend_mx_kmajor_decode,
                         ascend_mx_kmajor_encode_from_blocks, is_ascend_mx_layout)
from .nz import nd_to_nz, nz_shape, nz_to_nd


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


# ---------------------------------------------------------------------------------------------
# Ascend 950: K-major MX pairs


def _kmajor_encode(operand: Any) -> Encoded:
    gm, gk = operand.granularity
    *_, mn, k = operand.shape
    scale = ascend_mx_kmajor_encode_from_blocks(operand.scale, mn, k, block_mn=gm, block_k=gk)
    return Encoded(operand.data.contiguous(), scale, (1, MX_BLOCK_K))


def _kmajor_decode(operand: Any) -> Decoded:
    gran = tuple(operand.storage_granularity)
    return Decoded(operand.data, ascend_mx_kmajor_decode(operand.scale, ceil_div(operand.shape[-1], gran[1])), gran)


def _kmajor_validate(operand: Any) -> str | None:
    if tuple(operand.storage_granularity) != (1, MX_BLOCK_K):
        return f"storage granularity {operand.storage_granularity} is not (1, {MX_BLOCK_K})"
    *lead, mn, k = operand.shape
    pairs = ceil_div(ceil_div(k, MX_BLOCK_K), ASCEND_BLOCKS_PER_WORD)
    problem = nd_data_problem(operand) or scale_problem(operand, torch.float8_e8m0fnu,
                                                        (*lead, mn, pairs, ASCEND_BLOCKS_PER_WORD))
    if problem is None and not operand.scale.is_contiguous():
        problem = f"scale pairs have strides {operand.scale.stride()}, expected contiguous"
    return problem


ASCEND_MX_KMAJOR = Format(
    name="ascend-mx-ue8m0-kmajor-pairs",
    elements=ELEMENTS,
    scale_storage="float8_e8m0fnu [(G,) MN, ceil(K/64), 2], contiguous: the two exponents of a 64-element K pair "
                  "adjacent (even block first), K pairs of a row adjacent; an odd trailing block pairs with 0",
    granularity=_MX_GRANULARITY,
    requires_pow2=True,
    encode=_kmajor_encode,
    decode=_kmajor_decode,
    storage_granularity=_mx_granularity,
    validate=_kmajor_validate,
)


# ---------------------------------------------------------------------------------------------
# Atlas A2/A3: dequantized values


def block_dequantize(data: torch.Tensor, scale: torch.Tensor, granularity: tuple[int, int],
                     dtype: torch.dtype) -> torch.Tensor:
    """`data x scale` in `dtype`: e4m3 data `[..., MN, K]`, fp32 block scales `[..., ceil(MN/gm), ceil(K/gk)]`.

    Example: data row [1.5, -2.0] with granularity (1, 2) and scale [[0.25]] -> [0.375, -0.5], exact
    in bf16 (a power-of-two scale only shifts the exponent). A result that would round in `dtype`
    (bf16 with a scale like 0.3) raises LayoutConversionError: nothing here changes a number."""
    values = data.float() * _expanded(scale, granularity, data.shape[-2], data.shape[-1])
    out = values.to(dtype)
    if dtype != torch.float32 and not torch.equal(out.float(), values):
        raise LayoutConversionError(f"data x scale does not fit {dtype} exactly (scales that are not powers of "
                                    "two); store it in fp32 instead")
    return out


def _expanded(scale: torch.Tensor, granularity: tuple[int, int], mn: int, k: int) -> torch.Tensor:
    gm, gk = granularity
    return scale.repeat_interleave(gm, dim=-2)[..., :mn, :].repeat_interleave(gk, dim=-1)[..., :k]


def _values_decode(operand: Any) -> Decoded:
    """Back to e4m3 data: values / scale rounds to the original code (the fp32 product differs from
    data x scale by at most an fp32 ulp, far inside half an e4m3 step), so the round trip is exact."""
    gran = tuple(operand.storage_granularity)
    mn, k = operand.data.shape[-2], operand.data.shape[-1]
    data = (operand.data.float() / _expanded(operand.scale, gran, mn, k)).to(torch.float8_e4m3fn)
    return Decoded(data, operand.scale, gran)


def _values_format(name: str, dtype: torch.dtype, requires_pow2: bool, why: str) -> Format:
    def encode(operand: Any) -> Encoded:
        gran = tuple(operand.granularity)
        values = block_dequantize(operand.data, operand.scale, gran, dtype)
        return Encoded(values, operand.scale.contiguous(), gran)

    def validate(operand: Any) -> str | None:
        data = operand.data
        if data.dtype != dtype or tuple(data.shape) != tuple(operand.shape):
            return f"data is {data.dtype} {tuple(data.shape)}, expected {dtype} values of shape {tuple(operand.shape)}"
        return scale_problem(operand, torch.float32, block_scale_shape(operand))

    kind = str(dtype).replace("torch.", "")
    return Format(
        name=name,
        elements=("e4m3",),
        scale_storage=f"fp32 block scales as quantized, kept for decoding only (the kernels read the {kind} "
                      f"values, {why})",
        granularity="as quantized (folded into the values at ingest)",
        requires_pow2=requires_pow2,
        encode=encode,
        decode=_values_decode,
        storage_granularity=lambda granularity: tuple(granularity),
        data_layout=f"ND, K contiguous: {kind} values data x scale",
        validate=validate,
    )


ASCEND_BF16_VALUES = _values_format("ascend-dequantized-bf16", torch.bfloat16, True,
                                    "exact: power-of-two scales only; 2 bytes per element")
ASCEND_FP32_VALUES = _values_format("ascend-dequantized-fp32", torch.float32, False,
                                    "exact for any fp32 scale; 4 bytes per element")
