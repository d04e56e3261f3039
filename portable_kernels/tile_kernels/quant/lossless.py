"""TileKernels' `per_block_cast_lossless` and `swiglu_backward_and_per_token_cast` over the portable
ops of the same names (`ops.quant.lossless`, `ops.swiglu_backward`), with TileKernels' signatures,
returns and scale storages.

per_block_cast_lossless: x is TileKernels' FP4 pair (int8 [M, K/2] packed E2M1, scales fp32 /
col-major fp32 / packed UE8M0 words); the output scales come back in the storage the flags ask for.
swiglu_backward_and_per_token_cast: x is the FP8 pair (e4m3 [M, 2H] or [..., 2H], fp32 [M, 2H / n]);
returns (out, (x_grad_fp8, x_grad_sf), x_grad, weight_grad) as TileKernels.
The portable ops' errors name their own arguments (data / sf, x_data / x_sf); here they name x.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...core.errors import ContractError, format_problem
from ...core.tensors import cdiv, describe
from ...ops.quant.lossless import per_block_cast_lossless as portable_lossless
from ...ops.swiglu_backward import swiglu_backward_and_per_token_cast as portable_swiglu_backward
from ._scales import FP4_DTYPES, check_storage_flags, logical_scales, store_scales


def _pair(op: str, x: Any) -> tuple[Any, Any]:
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise ContractError(format_problem(op, "x", describe(x), "a (data, scale factors) pair",
                                           "pass the pair a cast returned"))
    return x[0], x[1]


def _block(op: str, arg: str, block: Any) -> tuple[int, int]:
    if not (isinstance(block, (tuple, list)) and len(block) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in block)):
        raise ContractError(format_problem(op, arg, repr(block), "a pair of positive ints (rows, columns)",
                                           "pass e.g. (1, 32)"))
    return int(block[0]), int(block[1])


def _naming_x(exc: ContractError, *args: str) -> ContractError:
    message = str(exc)
    for arg in args:
        message = message.replace(f"argument '{arg}'", f"argument 'x' ({arg})")
    return ContractError(message)


def per_block_cast_lossless(x: tuple[torch.Tensor, torch.Tensor], fmt: str, x_block_size: tuple[int, int],
                            out_block_size: tuple[int, int], use_tma_aligned_col_major_sf: bool = False,
                            round_sf: bool = False, use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [M, K], sf) holding exactly x's values: per out_block_size block the scale is the
    largest input scale / 2^6 (power of two; round_sf changes nothing), stored as the flags ask."""
    op = "per_block_cast_lossless"
    if fmt != "e4m3":
        raise ContractError(format_problem(op, "fmt", repr(fmt), "'e4m3'", "lossless recasts go E2M1 -> E4M3 only"))
    check_storage_flags(op, round_sf, use_tma_aligned_col_major_sf, use_packed_ue8m0)
    data, sf = _pair(op, x)
    if not isinstance(data, torch.Tensor) or data.dtype not in FP4_DTYPES or data.dim() != 2:
        raise ContractError(format_problem(op, "x", f"data {describe(data)}", "packed E2M1 int8 [M, K/2]",
                                           "pass the data of an e2m1 cast"))
    ib = _block(op, "x_block_size", x_block_size)
    ob = _block(op, "out_block_size", out_block_size)
    m, k = data.shape[0], data.shape[1] * 2
    scale = logical_scales(op, "x", sf, cdiv(m, ib[0]), cdiv(k, ib[1]))
    try:
        out, out_sf = portable_lossless(data, scale, ib, ob)
    except ContractError as exc:
        raise _naming_x(exc, "data", "sf") from exc
    return out, store_scales(out_sf, use_tma_aligned_col_major_sf, use_packed_ue8m0)


def swiglu_backward_and_per_token_cast(
        x: tuple[torch.Tensor, torch.Tensor], grad_out: torch.Tensor, weight: torch.Tensor,
        pos_to_token_topk: torch.Tensor, token_topk_to_pos: torch.Tensor, num_per_channels: int,
        round_sf: bool = False, swiglu_clamp_value: Optional[float] = None
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]:
    """(out bf16 [M, H], (x_grad e4m3 [M, 2H], fp32 sf [M, 2H / n]), x_grad bf16 [M, 2H],
    weight_grad fp32 [T, K]) of SwiGLU's backward pass (ops.swiglu_backward)."""
    op = "swiglu_backward_and_per_token_cast"
    data, sf = _pair(op, x)
    if not isinstance(data, torch.Tensor) or data.dim() not in (2, 3) or data.shape[-1] % 2:
        raise ContractError(format_problem(op, "x", f"data {describe(data)}", "e4m3 [M, 2H] (or [..., M, 2H])",
                                           "pass the FP8 forward input"))
    two_h = data.shape[-1]
    data = data.reshape(-1, two_h)
    if isinstance(grad_out, torch.Tensor) and grad_out.numel() == data.shape[0] * (two_h // 2):
        grad_out = grad_out.reshape(-1, two_h // 2)
    try:
        out, q, q_sf, x_grad, weight_grad = portable_swiglu_backward(
            data, sf, grad_out, weight, pos_to_token_topk, token_topk_to_pos, num_per_channels, round_sf,
            swiglu_clamp_value)
    except ContractError as exc:
        raise _naming_x(exc, "x_data", "x_sf") from exc
    return out, (q, q_sf), x_grad, weight_grad
