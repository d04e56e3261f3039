"""`deep_gemm.utils.math`: DeepGEMM's casts and small math helpers with its signatures and its bytes.

The casts call the semantic quantizers with convention="deep_gemm" (x * (1/sf); FP4 ties toward
zero, zero coded +0), so data and scales are DeepGEMM's byte for byte, and return plain tuples like
DeepGEMM's. Packed FP4 comes back as int8 (two codes per byte, even element in the low nibble);
`use_packed_ue8m0=True` packs the scales' exponents four per int32, K-major, as DeepGEMM's casts do.
The layout utilities (`get_tma_aligned_size`, ...) are `deep_gemm.utils.layout`, as upstream.
"""

from __future__ import annotations

import torch

from ...ops.quant import fp4, fp8 as quantization
from ...core.errors import ContractError, format_problem
from ...layouts import pack_e2m1, unpack_e2m1, ue8m0_exponents, ue8m0_to_fp32
from ...layouts import ceil_to_ue8m0 as _ceil_to_ue8m0
from ...core.tensors import QuantTensor, describe

CONVENTION = "deep_gemm"
#: the scale DeepGEMM's FP4 cast pads packed scales with (2^0: exponent byte 127)
PACKED_PAD_SCALE = 1.0
#: what DeepGEMM's ceil_to_ue8m0 gives for inf / NaN (the exponent clamp at 254)
_UE8M0_MAX = 2.0 ** 127

__all__ = ["ceil_div", "align", "ceil_to_ue8m0", "pack_ue8m0_to_int", "unpack_ue8m0_from_int", "per_token_cast_to_fp8",
           "per_channel_cast_to_fp8", "per_block_cast_to_fp8", "per_custom_dims_cast_to_fp8", "per_token_cast_to_fp4",
           "transpose_packed_fp4", "cast_back_from_fp4"]


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2|x|) as fp32 (the exponent clamped to [1, 254]), elementwise, like DeepGEMM's:
    |x| is used, zero gives 2^-126 and inf / NaN give 2^127."""
    magnitude = x.abs().float()
    finite = torch.isfinite(magnitude)
    return torch.where(finite, _ceil_to_ue8m0(torch.where(finite, magnitude, 1.0)), _UE8M0_MAX)


def pack_ue8m0_to_int(x: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 scales [..., 4n] -> their exponent bytes packed four per int32 [..., n] (K-major)."""
    if x.dtype != torch.float32 or x.shape[-1] % 4:
        raise ContractError(format_problem("pack_ue8m0_to_int", "x", describe(x), "fp32 [..., 4n] power-of-two scales",
                                           "pad the scales to a multiple of 4 columns"))
    return ue8m0_exponents(x.contiguous()).view(torch.int32)


def unpack_ue8m0_from_int(packed_sf: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_ue8m0_to_int: int32 [..., n] -> fp32 [..., 4n]."""
    return ue8m0_to_fp32(packed_sf.contiguous().view(torch.uint8))


def _two_dims(op: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ContractError(format_problem(op, "x", describe(x), "a 2-D tensor", "cast one matrix at a time"))


def _pack_scales(op: str, sf: torch.Tensor, pad: bool) -> torch.Tensor:
    if sf.shape[-1] % 4:
        if not pad:
            raise ContractError(format_problem(op, "use_packed_ue8m0", f"True with {sf.shape[-1]} scales per row",
                                               "a multiple of 4 scales per row (K a multiple of 4 * gran_k)",
                                               "pass use_packed_ue8m0=False, or pad K"))
        sf = torch.nn.functional.pad(sf, (0, 4 - sf.shape[-1] % 4), value=PACKED_PAD_SCALE)
    return pack_ue8m0_to_int(sf)


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128,
                          use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [M, K], fp32 [M, ceil(K/gran_k)] or packed int32 [M, ceil(K/gran_k)/4])."""
    _two_dims("per_token_cast_to_fp8", x)
    data, sf = quantization.per_token_cast_to_fp8(x, gran_k, use_ue8m0, convention=CONVENTION)
    return data, (_pack_scales("per_token_cast_to_fp8", sf, False) if use_packed_ue8m0 else sf)


def per_channel_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x [K, N] -> (fp8 [K, N], fp32 [ceil(K/gran_k), N]): one scale per gran_k rows of each column."""
    _two_dims("per_channel_cast_to_fp8", x)
    return tuple(quantization.per_channel_cast_to_fp8(x, gran_k, use_ue8m0, convention=CONVENTION))


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, K] -> (fp8 [N, K], fp32 [ceil(N/gran_k), ceil(K/gran_k)]): one scale per gran_k x gran_k block."""
    _two_dims("per_block_cast_to_fp8", x)
    return tuple(quantization.per_block_cast_to_fp8(x, (gran_k, gran_k), use_ue8m0, convention=CONVENTION))


def per_custom_dims_cast_to_fp8(x: torch.Tensor, dims: tuple, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x of any rank -> (fp8 like x, fp32 scales): one scale per index of the kept `dims`, over every
    other dim (DeepGEMM's sf.squeeze() shape: the kept dims' sizes, size-1 dims dropped). The bytes are
    the per-token cast's, run on x with the kept dims as rows and all the rest as one block."""
    op = "per_custom_dims_cast_to_fp8"
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise ContractError(format_problem(op, "x", describe(x), "a tensor with at least one dim", "pass a tensor"))
    kept = [d % x.dim() if isinstance(d, int) and -x.dim() <= d < x.dim() else None for d in dims]
    if None in kept or len(set(kept)) != len(kept):
        raise ContractError(format_problem(op, "dims", repr(dims), f"distinct dims of a {x.dim()}-D tensor",
                                           "name each dim that keeps its own scales once"))
    kept = sorted(kept)  # the scales keep x's dim order, as DeepGEMM's keepdim amax
    rest = [d for d in range(x.dim()) if d not in kept]
    moved = x.permute(*kept, *rest)
    rows = 1
    for d in kept:
        rows *= x.shape[d]
    flat = moved.reshape(rows, -1)
    data, sf = quantization.per_token_cast_to_fp8(flat, max(flat.shape[1], 1), use_ue8m0, convention=CONVENTION)
    inverse = [0] * x.dim()
    for position, d in enumerate([*kept, *rest]):
        inverse[d] = position
    data = data.view(moved.shape).permute(*inverse).contiguous()
    sf = sf.view([x.shape[d] if d in kept else 1 for d in range(x.dim())])
    return data, sf.squeeze()


def per_token_cast_to_fp4(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128,
                          use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K even) -> (int8 [M, K/2] packed E2M1, fp32 [M, ceil(K/gran_k)] or, with use_packed_ue8m0,
    int32 [M, ceil(ceil(K/gran_k)/4)] with the missing scales padded as 1.0, as DeepGEMM pads them)."""
    _two_dims("per_token_cast_to_fp4", x)
    if use_packed_ue8m0 and not use_ue8m0:
        raise ContractError(format_problem("per_token_cast_to_fp4", "use_packed_ue8m0", "True with use_ue8m0=False",
                                           "use_ue8m0=True (packed scales are exponents only)", "pass use_ue8m0=True"))
    data, sf = fp4.per_token_cast_to_fp4(x, gran_k, use_ue8m0, convention=CONVENTION)
    return data.view(torch.int8), (_pack_scales("per_token_cast_to_fp4", sf, True) if use_packed_ue8m0 else sf)


def transpose_packed_fp4(a: torch.Tensor) -> torch.Tensor:
    """int8 packed E2M1 [M, N/2] of a matrix -> int8 [N, M/2] of its transpose (M even)."""
    if not isinstance(a, torch.Tensor) or a.dtype != torch.int8 or a.dim() != 2 or a.shape[0] % 2:
        raise ContractError(format_problem("transpose_packed_fp4", "a", describe(a), "int8 [M, N/2] with M even",
                                           "pass the int8 data of per_token_cast_to_fp4"))
    return pack_e2m1(unpack_e2m1(a).T.contiguous()).view(torch.int8)


def cast_back_from_fp4(packed: torch.Tensor, sf: torch.Tensor, gran_k: int = 128,
                       use_packed_ue8m0: bool = False) -> torch.Tensor:
    """fp32 [M, K] values of packed E2M1 [M, K/2] with per-(1, gran_k) scales (fp32, or packed int32);
    zero codes give +0 (DeepGEMM decodes the negative-zero code as +0)."""
    if use_packed_ue8m0:
        sf = unpack_ue8m0_from_int(sf)
    codes = unpack_e2m1(packed)
    k = codes.shape[-1]
    sf = sf[:, : ceil_div(k, gran_k)].contiguous()
    values = quantization.dequantize(QuantTensor(packed.view(torch.uint8), sf, (1, gran_k), element="e2m1"))
    return values + 0.0  # -0.0 + 0.0 = +0.0: DeepGEMM's zero has no sign
