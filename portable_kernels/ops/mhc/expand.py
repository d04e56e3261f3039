"""`mhc_expand(hidden, mhc_mult)` and its backward: TileKernels' `expand_to_mhc`, the entry of the
mHC residual stream (an embedding [..., H] becomes mhc_mult identical streams [..., mhc_mult, H]).

Contract: out[..., m, :] = hidden[..., :] for every m (same dtype, a fresh contiguous tensor).
Backward: hidden_grad[...] = Σ_m out_grad[..., m, :], summed in fp32 and rounded once to
out_grad's dtype.
"""

from __future__ import annotations

import torch

from ...core.checks import check_int
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ._common import BF16_TOLERANCE, MhcInputs, tensor

FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def expand_reference(hidden: torch.Tensor, mhc_mult: int) -> torch.Tensor:
    return hidden.unsqueeze(-2).repeat_interleave(mhc_mult, dim=-2).contiguous()


def expand_backward_reference(out_grad: torch.Tensor) -> torch.Tensor:
    return out_grad.float().sum(-2).to(out_grad.dtype)


MHC_EXPAND = register_contract(OpContract(
    "mhc_expand", expand_reference, Tolerance(dequantized=0.0),
    kernel=lambda call: expand_reference(call.tensors[0], call.params[0])))
MHC_EXPAND_BACKWARD = register_contract(OpContract(
    "mhc_expand_backward", expand_backward_reference, Tolerance(dequantized=BF16_TOLERANCE),
    kernel=lambda call: expand_backward_reference(call.tensors[0])))


@public_op(MHC_EXPAND)
def mhc_expand(hidden: torch.Tensor, mhc_mult: int) -> torch.Tensor:
    """hidden [..., H] (bf16 / fp16 / fp32) -> [..., mhc_mult, H] (mhc_mult copies per token)."""
    if is_compiling():
        return compiled_call("mhc_expand", hidden, mhc_mult)
    op = MHC_EXPAND.name
    hidden = tensor(op, "hidden", hidden, FLOATS, None, None, "pass the embedding [..., H]")
    check_int(op, "mhc_mult", mhc_mult, 1, fix="pass the number of residual streams (4 in DeepSeek-V4)")
    return run(MHC_EXPAND, MhcInputs((hidden,), (int(mhc_mult),)))


@public_op(MHC_EXPAND_BACKWARD)
def mhc_expand_backward(out_grad: torch.Tensor) -> torch.Tensor:
    """out_grad [..., M, H] -> hidden_grad [..., H]: the sum over the M streams (fp32, rounded once)."""
    if is_compiling():
        return compiled_call("mhc_expand_backward", out_grad)
    op = MHC_EXPAND_BACKWARD.name
    out_grad = tensor(op, "out_grad", out_grad, FLOATS, None, None, "pass the gradient [..., M, H]", min_dim=2)
    return run(MHC_EXPAND_BACKWARD, MhcInputs((out_grad,)))


__all__ = ["mhc_expand", "mhc_expand_backward", "expand_reference", "expand_backward_reference", "MHC_EXPAND",
           "MHC_EXPAND_BACKWARD"]
