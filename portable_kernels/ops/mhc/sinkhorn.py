"""`mhc_sinkhorn(x, repeat, eps)` and its backward: TileKernels' `sinkhorn_normalize`, which makes
each [M, M] residual-mixing matrix of mHC (nearly) doubly stochastic.

Contract (fp32 throughout, over the last two dims of x [..., M, M]):
  y = softmax(x, -1) + eps;  y = y / (Σ_rows y + eps)                        (columns, once)
  then repeat - 1 times:  y = y / (Σ_cols y + eps);  y = y / (Σ_rows y + eps)
(`Σ_rows` sums over dim -2, `Σ_cols` over dim -1.) Backward: the gradient of that map with respect
to x, written out step by step: each division y = z / (Σ z + eps) gives dz = (g - Σ g·y) / (Σ z + eps)
over the same dim, the softmax ds = s · (g - Σ g·s).
"""

from __future__ import annotations

import torch

from ...core.checks import check_int
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ...core.checks import fail
from ._common import MhcInputs, number, tensor

TOLERANCE = 1e-9


def _steps(x: torch.Tensor, repeat: int, eps: float) -> tuple[torch.Tensor, list[tuple[int, torch.Tensor,
                                                                                        torch.Tensor]]]:
    """softmax s and the (dim, divisor, output) of every normalization, in order."""
    s = torch.softmax(x, dim=-1)
    y = s + eps
    steps = []
    for dim in [-2] + [-1, -2] * (repeat - 1):
        div = y.sum(dim, keepdim=True) + eps
        y = y / div
        steps.append((dim, div, y))
    return s, steps


def sinkhorn_reference(x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    _, steps = _steps(x.float(), repeat, eps)
    return steps[-1][2]


def sinkhorn_backward_reference(grad: torch.Tensor, x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    s, steps = _steps(x.float(), repeat, eps)
    g = grad.float()
    for dim, div, y in reversed(steps):
        g = (g - (g * y).sum(dim, keepdim=True)) / div
    return s * (g - (g * s).sum(-1, keepdim=True))


MHC_SINKHORN = register_contract(OpContract(
    "mhc_sinkhorn", sinkhorn_reference, Tolerance(dequantized=TOLERANCE),
    kernel=lambda call: sinkhorn_reference(call.tensors[0], *call.params)))
MHC_SINKHORN_BACKWARD = register_contract(OpContract(
    "mhc_sinkhorn_backward", sinkhorn_backward_reference, Tolerance(dequantized=TOLERANCE),
    kernel=lambda call: sinkhorn_backward_reference(*call.tensors, *call.params)))


def _check(op: str, x: torch.Tensor, repeat: int, eps: float) -> tuple[torch.Tensor, float]:
    x = tensor(op, "x", x, (torch.float32,), None, None, "pass the mixing logits as fp32 [..., M, M]", min_dim=2)
    if x.shape[-1] != x.shape[-2]:
        fail(op, "x", f"of shape {list(x.shape)}", "square matrices in the last two dims [..., M, M]",
             "pass comb_res_mix viewed as [..., M, M]")
    check_int(op, "repeat", repeat, 1, fix="pass the number of Sinkhorn iterations (10 in TileKernels)")
    return x, number(op, "eps", eps, 0.0, "pass a small positive epsilon, e.g. 1e-6")


@public_op(MHC_SINKHORN)
def mhc_sinkhorn(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """x fp32 [..., M, M] -> the Sinkhorn-normalized matrices, fp32 [..., M, M] (module docstring)."""
    if is_compiling():
        return compiled_call("mhc_sinkhorn", x, repeat, eps)
    x, eps = _check(MHC_SINKHORN.name, x, repeat, eps)
    return run(MHC_SINKHORN, MhcInputs((x,), (int(repeat), eps)))


@public_op(MHC_SINKHORN_BACKWARD)
def mhc_sinkhorn_backward(grad: torch.Tensor, x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """grad fp32 [..., M, M] (of the output), x the forward's input -> the gradient of x, fp32."""
    if is_compiling():
        return compiled_call("mhc_sinkhorn_backward", grad, x, repeat, eps)
    op = MHC_SINKHORN_BACKWARD.name
    x, eps = _check(op, x, repeat, eps)
    grad = tensor(op, "grad", grad, (torch.float32,), tuple(x.shape), x.device, "pass the output's fp32 gradient")
    return run(MHC_SINKHORN_BACKWARD, MhcInputs((grad, x), (int(repeat), eps)))


__all__ = ["mhc_sinkhorn", "mhc_sinkhorn_backward", "sinkhorn_reference", "sinkhorn_backward_reference",
           "MHC_SINKHORN", "MHC_SINKHORN_BACKWARD"]
