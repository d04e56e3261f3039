"""TileKernels' `swiglu_forward_and_per_token_cast` (and the per-channel variant) over the portable
ops, with TileKernels' signature, bytes and scale storage.

With round_sf and the default amax floor, TileKernels' bytes are exactly the fused portable op's
(`swiglu_forward_and_per_token_cast`: dividing by a power-of-two scale is multiplying by its
inverse), so that op — and any native provider of it — runs. Otherwise TileKernels' scale rule
(x · 448/amax) or floor (sf_clamp_min) differs from the fused op's, and the call runs as
`swiglu_forward` then `block_cast`, the same math in two steps. Rows with pos_to_expert -1 come
back as zeros (TileKernels leaves them unwritten).
"""

from __future__ import annotations

from typing import Optional

import torch

from ...ops.quant.block_cast import DEFAULT_CLAMP_MIN, block_cast
from ...core.checks import check_int
from ...core.errors import ContractError, format_problem
from ...ops.swiglu import swiglu_forward_and_per_token_cast as fused_swiglu_cast
from ...ops.swiglu import swiglu_forward
from ._scales import check_storage_flags, store_scales


def _check_x(op: str, x: object) -> int:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] % 2:
        raise ContractError(format_problem(op, "x", repr(getattr(x, "shape", x)), "a 2-D tensor [M, 2 * hidden]",
                                           "pass the gate/up projection output, gate half first"))
    return x.shape[1] // 2


def swiglu_forward_and_per_token_cast(
        x: torch.Tensor, fmt: str, num_per_channels: int, pos_to_token_topk: Optional[torch.Tensor] = None,
        topk_weights: Optional[torch.Tensor] = None, pos_to_expert: Optional[torch.Tensor] = None,
        use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False, use_packed_ue8m0: bool = False,
        swiglu_clamp_value: Optional[float] = None, clamped_count: Optional[torch.Tensor] = None,
        sf_clamp_min: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [M, hidden], sf) of silu(gate)·up (· routing weight) cast per (1, num_per_channels);
    num_per_channels 0 means hidden; sf_clamp_min: None (1e-4) or the amax floor of the cast."""
    op = "swiglu_forward_and_per_token_cast"
    hidden = _check_x(op, x)
    check_int(op, "num_per_channels", num_per_channels, 0, fix="pass 128, or 0 / hidden for one scale per row")
    check_storage_flags(op, round_sf, use_tma_aligned_col_major_sf, use_packed_ue8m0)
    per = num_per_channels or hidden
    floor = DEFAULT_CLAMP_MIN["e4m3"]
    if round_sf and (sf_clamp_min is None or sf_clamp_min == floor):
        data, sf = fused_swiglu_cast(x, fmt, per, pos_to_token_topk, topk_weights, pos_to_expert, False, True, False,
                                     swiglu_clamp_value, clamped_count)
    else:
        if fmt != "e4m3":
            raise ContractError(format_problem(op, "fmt", repr(fmt), "'e4m3'", "pass 'e4m3'"))
        y = swiglu_forward(x, pos_to_token_topk, topk_weights, swiglu_clamp_value, clamped_count,
                           pos_to_expert=pos_to_expert)
        data, sf = block_cast(y, "e4m3", (1, per), round_sf, clamp_min=sf_clamp_min)
    return data, store_scales(sf, use_tma_aligned_col_major_sf, use_packed_ue8m0)


def swiglu_forward_and_per_channel_cast_and_transpose(
        x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False, without_transpose: bool = False,
        swiglu_clamp_value: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [hidden, M] (or [M, hidden] with without_transpose), fp32 sf [ceil(M/num_per_tokens), hidden])
    of silu(gate)·up, rounded to x's dtype (bf16) as TileKernels, cast with one scale per
    (num_per_tokens rows, 1 column)."""
    op = "swiglu_forward_and_per_channel_cast_and_transpose"
    _check_x(op, x)
    check_int(op, "num_per_tokens", num_per_tokens, 1, fix="pass 128 (or 32)")
    if fmt != "e4m3":
        raise ContractError(format_problem(op, "fmt", repr(fmt), "'e4m3'", "pass 'e4m3'"))
    if not isinstance(without_transpose, bool):
        raise ContractError(format_problem(op, "without_transpose", repr(without_transpose), "a bool",
                                           "pass True or False"))
    # TileKernels stores the activation in x's dtype (bf16) before its amax and cast: so does this
    y = swiglu_forward(x, None, None, swiglu_clamp_value).to(x.dtype)
    data, sf = block_cast(y, "e4m3", (num_per_tokens, 1), round_sf)
    return (data if without_transpose else data.t().contiguous()), sf
