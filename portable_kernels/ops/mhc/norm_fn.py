"""`mhc_pre_norm_fn(residual, fn, norm_eps)` and its backward: TileKernels' `mhc_pre_norm_fn`, the
projection of an RMS-normalized token's M streams onto the 2M + M² mixes (the RMSNorm weight, when
there is one, is folded into fn by the caller: fn · norm_weight).

Contract, per token, with x = residual[..., :, :].flatten() in fp32 (K = M · H values):
  mul = fn · x  (fp32 [M3]),  r = (Σ x² / K + norm_eps)^(-1/2),  out = mul · r   (fp32 [..., M3])
Backward, g = out_grad: d_mul = g · r; d_sqrsum = -r³ / (2K) · Σ g · mul;
  residual_grad = fn^T · d_mul + 2 x · d_sqrsum  (bf16, rounded once),  fn_grad = Σ_tokens d_mul x^T (fp32).
TileKernels rounds fn to TF32 on a GPU; the contract is the fp32 math (TF32 stays within its
test's 1e-3).
"""

from __future__ import annotations

import torch

from ...core.checks import fail
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ._common import MhcInputs, number, tensor

TOLERANCE = 1e-7
#: tokens widened to fp32 at a time by the reference kernel (bounds its temporaries)
ROW_BLOCK = 1024


def _rows(residual: torch.Tensor) -> torch.Tensor:
    return residual.reshape(-1, residual.shape[-2] * residual.shape[-1])


def pre_norm_fn_reference(residual: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    x = _rows(residual).float()
    r = torch.rsqrt(x.square().sum(-1, keepdim=True) / x.shape[-1] + norm_eps)
    return ((x @ fn.T) * r).reshape(*residual.shape[:-2], fn.shape[0])


def pre_norm_fn_backward_reference(out_grad: torch.Tensor, residual: torch.Tensor, fn: torch.Tensor,
                                   norm_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = _rows(residual).float()
    g = out_grad.reshape(-1, fn.shape[0])
    k = x.shape[-1]
    r = torch.rsqrt(x.square().sum(-1, keepdim=True) / k + norm_eps)
    mul = x @ fn.T
    d_mul = g * r
    d_sqrsum = -(r ** 3) / (2 * k) * (g * mul).sum(-1, keepdim=True)
    x_grad = d_mul @ fn + 2 * x * d_sqrsum
    return x_grad.to(residual.dtype).reshape(residual.shape), d_mul.T @ x


def _forward_kernel(call: MhcInputs) -> torch.Tensor:
    residual, fn = call.tensors
    rows = _rows(residual)
    out = torch.empty(rows.shape[0], fn.shape[0], dtype=torch.float32, device=residual.device)
    for r0 in range(0, rows.shape[0], ROW_BLOCK):
        block = rows[r0:r0 + ROW_BLOCK]
        out[r0:r0 + ROW_BLOCK] = pre_norm_fn_reference(block.unsqueeze(-2), fn, *call.params)
    return out.reshape(*residual.shape[:-2], fn.shape[0])


def _backward_kernel(call: MhcInputs) -> tuple[torch.Tensor, torch.Tensor]:
    out_grad, residual, fn = call.tensors
    rows, g = _rows(residual), out_grad.reshape(-1, fn.shape[0])
    x_grad = torch.empty_like(rows)
    fn_grad = torch.zeros_like(fn)
    for r0 in range(0, rows.shape[0], ROW_BLOCK):
        xg, fg = pre_norm_fn_backward_reference(g[r0:r0 + ROW_BLOCK], rows[r0:r0 + ROW_BLOCK].unsqueeze(-2), fn,
                                                *call.params)
        x_grad[r0:r0 + ROW_BLOCK] = xg.reshape(-1, rows.shape[1])
        fn_grad += fg
    return x_grad.reshape(residual.shape), fn_grad


MHC_PRE_NORM_FN = register_contract(OpContract(
    "mhc_pre_norm_fn", pre_norm_fn_reference, Tolerance(dequantized=TOLERANCE), kernel=_forward_kernel))
MHC_PRE_NORM_FN_BACKWARD = register_contract(OpContract(
    "mhc_pre_norm_fn_backward", pre_norm_fn_backward_reference, Tolerance(dequantized=TOLERANCE),
    kernel=_backward_kernel))


def _args(op: str, residual, fn, norm_eps):
    residual = tensor(op, "residual", residual, (torch.bfloat16,), None, None,
                      "pass the residual streams as bf16 [..., M, H]", min_dim=2)
    k = residual.shape[-2] * residual.shape[-1]
    fn = tensor(op, "fn", fn, (torch.float32,), (None, k), residual.device,
                f"pass the projection as fp32 [2M + M², M·H = {k}]")
    if k == 0 or fn.shape[0] == 0:
        fail(op, "fn", f"of shape {list(fn.shape)}", "a non-empty projection", "pass M, H >= 1 and 2M + M² rows")
    return residual, fn, number(op, "norm_eps", norm_eps, 0.0, "pass the RMSNorm epsilon, e.g. 1e-6")


@public_op(MHC_PRE_NORM_FN)
def mhc_pre_norm_fn(residual: torch.Tensor, fn: torch.Tensor, norm_eps: float = 1e-6) -> torch.Tensor:
    """residual bf16 [..., M, H], fn fp32 [M3, M·H] -> the RMS-normalized projection fp32 [..., M3]."""
    if is_compiling():
        return compiled_call("mhc_pre_norm_fn", residual, fn, norm_eps)
    residual, fn, eps = _args(MHC_PRE_NORM_FN.name, residual, fn, norm_eps)
    return run(MHC_PRE_NORM_FN, MhcInputs((residual, fn), (eps,)))


@public_op(MHC_PRE_NORM_FN_BACKWARD)
def mhc_pre_norm_fn_backward(out_grad: torch.Tensor, residual: torch.Tensor, fn: torch.Tensor,
                             norm_eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """out_grad fp32 [..., M3] -> (residual_grad bf16 [..., M, H], fn_grad fp32 [M3, M·H])."""
    if is_compiling():
        return compiled_call("mhc_pre_norm_fn_backward", out_grad, residual, fn, norm_eps)
    op = MHC_PRE_NORM_FN_BACKWARD.name
    residual, fn, eps = _args(op, residual, fn, norm_eps)
    out_grad = tensor(op, "out_grad", out_grad, (torch.float32,), (*residual.shape[:-2], fn.shape[0]),
                      residual.device, "pass the fp32 gradient of the mixes")
    return run(MHC_PRE_NORM_FN_BACKWARD, MhcInputs((out_grad, residual, fn), (eps,)))


__all__ = ["mhc_pre_norm_fn", "mhc_pre_norm_fn_backward", "pre_norm_fn_reference", "pre_norm_fn_backward_reference"]
