"""TileKernels' scale-factor storage, read and written with the layouts' packers.

Storage (TileKernels' flags): fp32 row-major [rows, kb]; `use_tma_aligned_col_major_sf`: fp32 with
strides (1, align(rows, 4)) — the SM90 Format's per-row scales; `use_packed_ue8m0` (with the
col-major flag and power-of-two scales): int32 [rows, ceil(kb/4)], four exponent bytes per word,
strides (1, align(rows, 4)) — the SM100 Format's words. For per-token casts these are exactly
what `SM90.encode` / `SM100.encode` store; for (m, n) blocks TileKernels lays the block-row matrix
out the same way, so the same packers run on it. Quantized inputs are read back from any of the
three forms, any strides.
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.errors import ContractError, format_problem
from ...layouts.constants import SM100_BLOCKS_PER_WORD
from ...layouts.fp8_scales import sm90_sfa_encode, sm100_ue8m0_decode, sm100_ue8m0_encode
from ...ops.quant.fp8 import dequantize
from ...core.tensors import FP8_DTYPE, QuantTensor, cdiv, describe

#: TileKernels' element dtypes: FP8 as float8_e4m3fn, FP4 packed two codes per int8
FP4_DTYPES = (torch.int8, torch.uint8)


def check_storage_flags(op: str, round_sf: Any, col_major: Any, packed: Any) -> None:
    for arg, value in (("round_sf", round_sf), ("use_tma_aligned_col_major_sf", col_major),
                       ("use_packed_ue8m0", packed)):
        if not isinstance(value, bool):
            raise ContractError(format_problem(op, arg, repr(value), "a bool", f"pass {arg}=True or False"))
    if packed and not (col_major and round_sf):
        raise ContractError(format_problem(op, "use_packed_ue8m0", "True without use_tma_aligned_col_major_sf and "
                                           "round_sf", "packed UE8M0 words only with col-major, power-of-two scales",
                                           "pass use_tma_aligned_col_major_sf=True, round_sf=True too"))


def store_scales(sf: torch.Tensor, col_major: bool, packed: bool) -> torch.Tensor:
    """fp32 logical scales [rows, kb] in TileKernels' requested storage."""
    if packed:
        return sm100_ue8m0_encode(sf)
    if col_major:
        return sm90_sfa_encode(sf)
    return sf


def logical_scales(op: str, arg: str, sf: Any, rows: int, kb: int) -> torch.Tensor:
    """fp32 [rows, kb] from fp32 scales (any strides) or packed int32 words [rows, ceil(kb/4)]."""
    if isinstance(sf, torch.Tensor) and sf.dtype == torch.int32 and tuple(sf.shape) == (
            rows, cdiv(kb, SM100_BLOCKS_PER_WORD)):
        return sm100_ue8m0_decode(sf, kb)
    if not (isinstance(sf, torch.Tensor) and sf.dtype == torch.float32 and tuple(sf.shape) == (rows, kb)):
        raise ContractError(format_problem(op, arg, describe(sf), f"fp32 scales [{rows}, {kb}] or packed int32 "
                                           f"[{rows}, {cdiv(kb, SM100_BLOCKS_PER_WORD)}]",
                                           "pass the scales returned with the data"))
    return sf


def dequantized_input(op: str, x: Any, block: Any) -> torch.Tensor:
    """fp32 values of TileKernels' quantized (data, sf) pair: fp8 [M, K] or packed FP4 int8 [M, K/2]."""
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise ContractError(format_problem(op, "x", describe(x), "a (data, scale factors) pair",
                                           "pass the pair a cast returned"))
    if not (isinstance(block, (tuple, list)) and len(block) == 2):
        raise ContractError(format_problem(op, "x_block_size", repr(block), "the input's (bm, bk) block",
                                           "pass the block size the input was cast with"))
    data, sf = x
    if not isinstance(data, torch.Tensor) or data.dim() != 2 or data.dtype not in (FP8_DTYPE, *FP4_DTYPES):
        raise ContractError(format_problem(op, "x", f"data {describe(data)}", "fp8 e4m3 [M, K] or packed FP4 int8 "
                                           "[M, K/2]", "pass the data a cast returned"))
    element = "e4m3" if data.dtype == FP8_DTYPE else "e2m1"
    m, k = data.shape[0], data.shape[1] * (2 if element == "e2m1" else 1)
    bm, bk = (int(v) for v in block)
    scale = logical_scales(op, "x", sf, cdiv(m, bm), cdiv(k, bk))
    values = data.view(torch.uint8) if element == "e2m1" else data
    return dequantize(QuantTensor(values, scale, (bm, bk), element=element))
