"""TileKernels' casts (`per_token_cast`, `per_block_cast`, `per_channel_cast` and their sf-only /
precomputed-sf / transposed variants, `cast_back`, `unpack_from_e2m1fn_x2`) over `block_cast` and
`dequantize`, with TileKernels' signatures, bytes and scale storage; `per_token_cast(x, 'e5m6', ...)`
and `cast_back(..., x_special_fmt='e5m6')` over `per_token_cast_to_e5m6` / `e5m6_cast_back`.

Returns are TileKernels': (data, sf) tuples, FP8 data as float8_e4m3fn, FP4 packed two codes per
int8 (even element low), E5M6 packed eight 12-bit codes per 12 bytes as uint8 [T, H * 3 / 2]; sf fp32,
or as the storage flags ask (see `_scales`). A quantized input
(data, sf) with `x_block_size` is dequantized to fp32 first (data · sf, as TileKernels does).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...ops.quant.block_cast import block_cast
from ...ops.quant.e5m6 import e5m6_cast_back, per_token_cast_to_e5m6
from ...core.checks import check_int
from ...core.errors import ContractError, format_problem
from ...layouts.fp4 import e2m1_decode, unpack_e2m1
from ...core.tensors import cdiv, describe
from ._scales import FP4_DTYPES, check_storage_flags, dequantized_input, logical_scales, store_scales

#: TileKernels' names of the cast formats provided here
CAST_FORMATS = ("e4m3", "e2m1")
#: the special formats cast_back reads (x_special_fmt)
SPECIAL_FORMATS = ("e5m6",)
#: cast_back's output formats
BACK_FORMATS = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _cast(op: str, x: Any, fmt: Any, block: tuple[int, int], x_block_size: Any, col_major: Any, round_sf: Any,
          packed: Any, sf: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    if fmt not in CAST_FORMATS:
        fix = ("this cast has no E5M6 form (TileKernels casts to E5M6 with per_token_cast only, returning data "
               "and scales)" if fmt == "e5m6" else "cast to 'e4m3' or 'e2m1'")
        raise ContractError(format_problem(op, "fmt", repr(fmt), f"one of {CAST_FORMATS}", fix))
    check_storage_flags(op, round_sf, col_major, packed)
    if isinstance(x, (tuple, list)):
        x = dequantized_input(op, x, x_block_size)
    elif x_block_size is not None:
        raise ContractError(format_problem(op, "x_block_size", repr(x_block_size), "None for a bf16/fp32 input",
                                           "pass x as its (data, sf) pair, or drop x_block_size"))
    if isinstance(x, torch.Tensor) and x.dim() == 2 and sf is not None:
        sf = logical_scales(op, "sf", sf, cdiv(x.shape[0], block[0]), cdiv(x.shape[1], block[1])).contiguous()
    q = block_cast(x, fmt, block, round_sf, sf=sf)
    data = q.data.view(torch.int8) if fmt == "e2m1" else q.data
    return data, store_scales(q.scale, col_major, packed)


def per_token_cast(x: Any, fmt: str, num_per_channels: int, x_block_size: Optional[tuple[int, int]] = None,
                   use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                   use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast [T, H] (bf16/fp32, or a quantized pair with x_block_size) per (1, num_per_channels).

    fmt 'e5m6': x bf16/fp32 [T, H] (H % 8 == 0, no x_block_size) -> (uint8 [T, H * 3 / 2], sf); TileKernels'
    kernel takes num_per_channels == H only, any width dividing into blocks is accepted here."""
    check_int("per_token_cast", "num_per_channels", num_per_channels, 1, fix="pass e.g. 128")
    if fmt == "e5m6":
        return _cast_e5m6(x, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                          use_packed_ue8m0)
    return _cast("per_token_cast", x, fmt, (1, num_per_channels), x_block_size, use_tma_aligned_col_major_sf,
                 round_sf, use_packed_ue8m0)


def _cast_e5m6(x: Any, num_per_channels: int, x_block_size: Any, col_major: Any, round_sf: Any,
               packed: Any) -> tuple[torch.Tensor, torch.Tensor]:
    op = "per_token_cast"
    check_storage_flags(op, round_sf, col_major, packed)
    if x_block_size is not None or isinstance(x, (tuple, list)):
        raise ContractError(format_problem(op, "x_block_size" if x_block_size is not None else "x",
                                           "a quantized input for fmt 'e5m6'", "a bf16/fp32 tensor [T, H]",
                                           "cast_back the input first, then cast it to e5m6"))
    if isinstance(x, torch.Tensor) and x.dtype == torch.float16:
        raise ContractError(format_problem(op, "x", describe(x), "bf16 or fp32 (TileKernels' e5m6 inputs)",
                                           "pass x.float()"))
    data, sf = per_token_cast_to_e5m6(x, num_per_channels, round_sf)
    return data, store_scales(sf, col_major, packed)


def per_token_cast_with_sf_only(x: Any, fmt: str, num_per_channels: int,
                                x_block_size: Optional[tuple[int, int]] = None,
                                use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                use_packed_ue8m0: bool = False) -> torch.Tensor:
    """Only the scale factors per_token_cast would return."""
    check_int("per_token_cast_with_sf_only", "num_per_channels", num_per_channels, 1, fix="pass e.g. 128")
    return _cast("per_token_cast_with_sf_only", x, fmt, (1, num_per_channels), x_block_size,
                 use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)[1]


def per_token_cast_with_precomputed_sf(x: Any, fmt: str, num_per_channels: int, sf: torch.Tensor,
                                       x_block_size: Optional[tuple[int, int]] = None,
                                       use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                       use_packed_ue8m0: bool = False) -> torch.Tensor:
    """Only the data, cast with the given scales (x · 1/sf); sf in any of TileKernels' storages."""
    check_int("per_token_cast_with_precomputed_sf", "num_per_channels", num_per_channels, 1, fix="pass e.g. 128")
    return _cast("per_token_cast_with_precomputed_sf", x, fmt, (1, num_per_channels), x_block_size,
                 use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, sf)[0]


def _block(op: str, block_size: Any) -> tuple[int, int]:
    if not (isinstance(block_size, (tuple, list)) and len(block_size) == 2):
        raise ContractError(format_problem(op, "block_size", repr(block_size), "a pair (num_per_tokens, "
                                           "num_per_channels)", "pass e.g. (128, 128)"))
    return block_size[0], block_size[1]


def per_block_cast(x: torch.Tensor, fmt: str, block_size: tuple[int, int],
                   use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                   use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast [M, K] with one scale per block_size block."""
    op = "per_block_cast"
    return _cast(op, x, fmt, _block(op, block_size), None, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


def per_block_cast_with_sf_only(x: torch.Tensor, fmt: str, block_size: tuple[int, int],
                                use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                use_packed_ue8m0: bool = False) -> torch.Tensor:
    """Only the scale factors per_block_cast would return."""
    op = "per_block_cast_with_sf_only"
    return _cast(op, x, fmt, _block(op, block_size), None, use_tma_aligned_col_major_sf, round_sf,
                 use_packed_ue8m0)[1]


def per_block_cast_with_precomputed_sf(x: torch.Tensor, fmt: str, block_size: tuple[int, int], sf: torch.Tensor,
                                       use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                       use_packed_ue8m0: bool = False) -> torch.Tensor:
    """Only the data, cast with the given per-block scales."""
    op = "per_block_cast_with_precomputed_sf"
    return _cast(op, x, fmt, _block(op, block_size), None, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                 sf)[0]


def _fp8_only(op: str, fmt: Any, num_per_tokens: Any) -> None:
    check_int(op, "num_per_tokens", num_per_tokens, 1, fix="pass e.g. 128")
    if fmt != "e4m3":
        raise ContractError(format_problem(op, "fmt", repr(fmt), "'e4m3'", "per-channel casts produce FP8 only"))


def per_channel_cast(x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast [T, H] with one scale per (num_per_tokens rows, 1 column): sf fp32 [ceil(T/num_per_tokens), H]."""
    _fp8_only("per_channel_cast", fmt, num_per_tokens)
    return _cast("per_channel_cast", x, fmt, (num_per_tokens, 1), None, False, round_sf, False)


def per_channel_cast_and_transpose(x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False
                                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """per_channel_cast with the data returned transposed: (fp8 [H, T] contiguous, fp32 [T/num_per_tokens, H])."""
    _fp8_only("per_channel_cast_and_transpose", fmt, num_per_tokens)
    data, sf = _cast("per_channel_cast_and_transpose", x, fmt, (num_per_tokens, 1), None, False, round_sf, False)
    return data.t().contiguous(), sf


def per_channel_cast_fused(x: Any, fmt: str, num_per_tokens: int, round_sf: bool = False,
                           num_per_channels: Optional[int] = None, pos_to_token: Optional[torch.Tensor] = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """per_channel_cast of x, where x may be a quantized pair (data, sf) with per-(1, num_per_channels)
    scales (dequantized first), and the rows may be gathered first: row r of the cast input is
    x[pos_to_token[r]], or zeros where pos_to_token[r] is -1 (int32 [P])."""
    op = "per_channel_cast_fused"
    _fp8_only(op, fmt, num_per_tokens)
    quantized = isinstance(x, (tuple, list))
    if quantized and num_per_channels is None:
        raise ContractError(format_problem(op, "num_per_channels", "None for a quantized x",
                                           "the input's scale block width", "pass e.g. num_per_channels=128"))
    values = dequantized_input(op, x, (1, num_per_channels)) if quantized else x
    if pos_to_token is not None:
        if not (isinstance(pos_to_token, torch.Tensor) and pos_to_token.dtype == torch.int32
                and pos_to_token.dim() == 1 and isinstance(values, torch.Tensor) and values.dim() == 2):
            raise ContractError(format_problem(op, "pos_to_token", describe(pos_to_token), "int32 [P] row indices "
                                               "(-1 = zero row)", "pass get_fused_mapping's pos_to_token"))
        if pos_to_token.numel() and int(pos_to_token.max()) >= values.shape[0]:
            raise ContractError(format_problem(op, "pos_to_token", "pointing past the rows of x",
                                               f"values < {values.shape[0]}", "pass the mapping built for x"))
        # a gather (data movement): the cast input's rows in the expanded order
        rows = values.index_select(0, pos_to_token.clamp(min=0).long())
        values = torch.where((pos_to_token >= 0)[:, None], rows, torch.zeros((), dtype=rows.dtype,
                                                                             device=rows.device))
    return _cast(op, values, fmt, (num_per_tokens, 1), None, False, round_sf, False)


def cast_back(x: tuple[torch.Tensor, torch.Tensor], fmt: str, x_block_size: tuple[int, int],
              x_special_fmt: Optional[str] = None) -> torch.Tensor:
    """Dequantize TileKernels' (data, sf) pair to bf16 or fp32 (fmt 'bf16' / 'fp32'): data · sf in fp32."""
    op = "cast_back"
    if fmt not in BACK_FORMATS:
        raise ContractError(format_problem(op, "fmt", repr(fmt), f"one of {tuple(BACK_FORMATS)}",
                                           "pass 'bf16' or 'fp32'"))
    if x_special_fmt is not None and x_special_fmt not in SPECIAL_FORMATS:
        raise ContractError(format_problem(op, "x_special_fmt", repr(x_special_fmt), f"None or one of "
                                           f"{SPECIAL_FORMATS}", "pass 'e5m6' for E5M6 data, None otherwise"))
    if x_special_fmt == "e5m6":
        return _cast_back_e5m6(op, x, x_block_size, BACK_FORMATS[fmt])
    return dequantized_input(op, x, x_block_size).to(BACK_FORMATS[fmt])


def _cast_back_e5m6(op: str, x: Any, block: Any, out_dtype: torch.dtype) -> torch.Tensor:
    """(uint8 [M, K * 3 / 2] E5M6, sf in any of TileKernels' storages) -> out_dtype [M, K]."""
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise ContractError(format_problem(op, "x", describe(x), "a (data, scale factors) pair",
                                           "pass the pair per_token_cast(x, 'e5m6', ...) returned"))
    if not (isinstance(block, (tuple, list)) and len(block) == 2):
        raise ContractError(format_problem(op, "x_block_size", repr(block), "the input's (bm, bk) block",
                                           "pass the block size the input was cast with"))
    data, sf = x
    if not (isinstance(data, torch.Tensor) and data.dtype == torch.uint8 and data.dim() == 2
            and data.shape[1] % 12 == 0):
        raise ContractError(format_problem(op, "x", f"data {describe(data)}", "uint8 [M, K * 3 / 2] packed E5M6 "
                                           "(x_special_fmt='e5m6')", "pass the data per_token_cast(x, 'e5m6') "
                                           "returned"))
    bm, bk = block
    check_int(op, "x_block_size[0]", bm, 1, fix="pass the block the data was cast with")
    check_int(op, "x_block_size[1]", bk, 1, fix="pass the block the data was cast with")
    m, k = data.shape[0], data.shape[1] // 12 * 8
    scale = logical_scales(op, "x", sf, cdiv(m, bm), cdiv(k, bk))
    return e5m6_cast_back(data, scale, (bm, bk), out_dtype)


def per_token_cast_back(x: tuple[torch.Tensor, torch.Tensor], fmt: str, num_per_channels: int,
                        x_special_fmt: Optional[str] = None) -> torch.Tensor:
    """cast_back with x_block_size (1, num_per_channels)."""
    return cast_back(x, fmt, (1, num_per_channels), x_special_fmt)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of packed FP4 (int8/uint8 [..., K/2], even element low) as out_dtype [..., K]; code 8 is -0.0."""
    if not isinstance(x, torch.Tensor) or x.dtype not in FP4_DTYPES or x.dim() == 0:
        raise ContractError(format_problem("unpack_from_e2m1fn_x2", "x", describe(x),
                                           "int8/uint8 packed FP4 with at least one dim", "pass a cast's FP4 data"))
    return e2m1_decode(unpack_e2m1(x)).to(out_dtype)
