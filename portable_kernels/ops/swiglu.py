"""`swiglu_forward`: SwiGLU with optional per-row routing weights, in fp32 (TileKernels'
`swiglu_forward`) — the activation half of `swiglu_forward_and_per_token_cast`, for callers that
quantize with another rule or layout (the tile_kernels module casts it with `block_cast`).

Contract: x [M, 2I], gate = x[:, :I] (first half), up = x[:, I:]; with swiglu_clamp_value c the
gate is clamped to <= c and up to [-c, c] first; y = silu(gate)·up (· topk_weights.flatten()
[pos_to_token_topk[r]] for row r) in fp32. Rows with pos_to_token_topk or pos_to_expert -1 are
padding and come back as zeros; clamped_count += (gate > c, up > c, up < -c) counted over the
other rows. The math is the one `swiglu_forward_and_per_token_cast` uses (`fp4.swiglu_reference`).
"""

from __future__ import annotations

import attrs
import torch

from ..core.compiled import compiled_call, is_compiling
from ..core.contract import OpContract, Tolerance, public_op, register_contract
from ..core.dispatch import run
from .quant.fp4 import _check_swiglu_args, _check_swiglu_values, swiglu_clamp_counts, swiglu_reference, swiglu_rows
from ..core.providers import Inputs


def swiglu_forward_reference(x: torch.Tensor, pos_to_token_topk: torch.Tensor | None = None,
                             topk_weights: torch.Tensor | None = None, pos_to_expert: torch.Tensor | None = None,
                             swiglu_clamp_value: float | None = None) -> torch.Tensor:
    """fp32 [M, I]: silu(gate)·up (· row weight), padding rows zero."""
    valid, weight = swiglu_rows(x.shape[0], pos_to_token_topk, topk_weights, pos_to_expert, x.device)
    out = swiglu_reference(x, weight, swiglu_clamp_value)
    return torch.where(valid[:, None], out, out.new_zeros(()))


@attrs.frozen
class SwigluForwardInputs(Inputs):
    """One swiglu_forward call (validated): x [M, 2I], the optional row mapping and weights, the clamp
    and clamped_count (int64 [3]) to add into. A provider returns fp32 [M, I]."""

    x: torch.Tensor
    pos_to_token_topk: torch.Tensor | None
    topk_weights: torch.Tensor | None
    pos_to_expert: torch.Tensor | None
    swiglu_clamp_value: float | None
    clamped_count: torch.Tensor | None
    device_field = "x"

    def dims(self) -> dict[str, int]:
        m, two_i = self.x.shape
        return {"M": m, "I": two_i // 2}


def swiglu_forward_kernel(call: SwigluForwardInputs) -> torch.Tensor:
    """Reference kernel: adds this call's clamp counts into clamped_count (when given), then the values."""
    if call.clamped_count is not None:
        valid, _ = swiglu_rows(call.x.shape[0], call.pos_to_token_topk, call.topk_weights, call.pos_to_expert,
                               call.x.device)
        call.clamped_count.add_(swiglu_clamp_counts(call.x, valid, call.swiglu_clamp_value))
    return swiglu_forward_reference(call.x, call.pos_to_token_topk, call.topk_weights, call.pos_to_expert,
                                    call.swiglu_clamp_value)


SWIGLU_FORWARD = register_contract(OpContract("swiglu_forward", swiglu_forward_reference,
                                              Tolerance(dequantized=1e-6), kernel=swiglu_forward_kernel))


@public_op(SWIGLU_FORWARD)
def swiglu_forward(x: torch.Tensor, pos_to_token_topk: torch.Tensor | None = None,
                   topk_weights: torch.Tensor | None = None, swiglu_clamp_value: float | None = None,
                   clamped_count: torch.Tensor | None = None, *,
                   pos_to_expert: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU in fp32 (TileKernels' `swiglu_forward` argument order); see the module docstring.

    x: bf16/fp16/fp32 [M, 2I], gate first; pos_to_token_topk: None or int32 [M], given together with
    topk_weights fp32 [num_tokens, num_topk]; swiglu_clamp_value: None or c > 0; clamped_count: None
    or int64 [3] (needs the clamp); pos_to_expert (keyword): None or int32 [M], -1 marks padding rows.
    Returns fp32 [M, I].
    """
    if is_compiling():
        return compiled_call("swiglu_forward", x, pos_to_token_topk, topk_weights, swiglu_clamp_value, clamped_count,
                             pos_to_expert=pos_to_expert)
    op = SWIGLU_FORWARD.name
    _check_swiglu_args(op, x, "e4m3", 1, pos_to_token_topk, topk_weights, pos_to_expert, False, False, False,
                       swiglu_clamp_value, clamped_count)
    _check_swiglu_values(op, pos_to_token_topk, topk_weights, pos_to_expert)
    clamp = None if swiglu_clamp_value is None else float(swiglu_clamp_value)
    return run(SWIGLU_FORWARD, SwigluForwardInputs(x, pos_to_token_topk, topk_weights, pos_to_expert, clamp,
                                                   clamped_count))
