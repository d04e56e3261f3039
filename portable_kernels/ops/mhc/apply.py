"""Reading from and writing to the mHC residual streams, and their backwards: TileKernels'
`mhc_pre_apply_mix` (the layer's input as a mix of the M streams) and `mhc_post` (the streams after
the layer: its output spread by the post mix plus the streams recombined by comb). Products and
sums in fp32, each bf16 result rounded once.

pre_apply_mix, x bf16 [..., M, H], mix fp32 [..., M, 1]:
  out[..., h] = Σ_m x[..., m, h] · mix[..., m]                           (bf16 [..., H])
  backward: x_grad = o_grad · mix (bf16 [..., M, H]), mix_grad = Σ_h o_grad · x (fp32 [..., M, 1])
post, x bf16 [..., H], residual bf16 [..., M, H], post_mix fp32 [..., M, 1], comb fp32 [..., M, M]:
  out[..., n, h] = x[..., h] · post_mix[..., n] + Σ_m comb[..., m, n] · residual[..., m, h]   (bf16)
  backward (g = d_out in fp32): d_x = Σ_n g[n] · post_mix[n] (bf16), d_residual[m] = Σ_n comb[m, n] ·
  g[n] (bf16), d_post_mix[n] = Σ_h g[n] · x (fp32), d_comb[m, n] = Σ_h residual[m] · g[n] (fp32)
"""

from __future__ import annotations

import torch

from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ._common import BF16_TOLERANCE, MhcInputs, tensor

BF16, F32 = (torch.bfloat16,), (torch.float32,)


def pre_apply_mix_reference(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    return (x.float() * mix).sum(-2).to(torch.bfloat16)


def pre_apply_mix_backward_reference(o_grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    g = o_grad.float().unsqueeze(-2)
    return (g * mix).to(torch.bfloat16), (g * x.float()).sum(-1, keepdim=True)


def post_reference(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, comb: torch.Tensor
                   ) -> torch.Tensor:
    mixed = torch.einsum("...mn,...mh->...nh", comb, residual.float())
    return (x.float().unsqueeze(-2) * post_mix + mixed).to(torch.bfloat16)


def post_backward_reference(d_out: torch.Tensor, x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor,
                            comb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = d_out.float()
    d_x = (g * post_mix).sum(-2).to(torch.bfloat16)
    d_residual = torch.einsum("...mn,...nh->...mh", comb, g).to(torch.bfloat16)
    d_post = (g * x.float().unsqueeze(-2)).sum(-1, keepdim=True)
    d_comb = torch.einsum("...mh,...nh->...mn", residual.float(), g)
    return d_x, d_residual, d_post, d_comb


MHC_PRE_APPLY_MIX = register_contract(OpContract(
    "mhc_pre_apply_mix", pre_apply_mix_reference, Tolerance(dequantized=BF16_TOLERANCE),
    kernel=lambda call: pre_apply_mix_reference(*call.tensors)))
MHC_PRE_APPLY_MIX_BACKWARD = register_contract(OpContract(
    "mhc_pre_apply_mix_backward", pre_apply_mix_backward_reference, Tolerance(dequantized=BF16_TOLERANCE),
    kernel=lambda call: pre_apply_mix_backward_reference(*call.tensors)))
MHC_POST = register_contract(OpContract(
    "mhc_post", post_reference, Tolerance(dequantized=BF16_TOLERANCE),
    kernel=lambda call: post_reference(*call.tensors)))
MHC_POST_BACKWARD = register_contract(OpContract(
    "mhc_post_backward", post_backward_reference, Tolerance(dequantized=BF16_TOLERANCE),
    kernel=lambda call: post_backward_reference(*call.tensors)))


def _apply_args(op: str, x, mix):
    x = tensor(op, "x", x, BF16, None, None, "pass the residual streams as bf16 [..., M, H]", min_dim=2)
    lead, m = tuple(x.shape[:-2]), x.shape[-2]
    mix = tensor(op, "mix", mix, F32, (*lead, m, 1), x.device, f"pass the fp32 pre mix [..., {m}, 1]")
    return x, mix


@public_op(MHC_PRE_APPLY_MIX)
def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """x bf16 [..., M, H], mix fp32 [..., M, 1] -> Σ_m x · mix as bf16 [..., H]."""
    if is_compiling():
        return compiled_call("mhc_pre_apply_mix", x, mix)
    x, mix = _apply_args(MHC_PRE_APPLY_MIX.name, x, mix)
    return run(MHC_PRE_APPLY_MIX, MhcInputs((x, mix)))


@public_op(MHC_PRE_APPLY_MIX_BACKWARD)
def mhc_pre_apply_mix_backward(o_grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """o_grad bf16 [..., H] -> (x_grad bf16 [..., M, H], mix_grad fp32 [..., M, 1])."""
    if is_compiling():
        return compiled_call("mhc_pre_apply_mix_backward", o_grad, x, mix)
    op = MHC_PRE_APPLY_MIX_BACKWARD.name
    x, mix = _apply_args(op, x, mix)
    shape = (*x.shape[:-2], x.shape[-1])
    o_grad = tensor(op, "o_grad", o_grad, BF16, shape, x.device, f"pass the bf16 gradient of the output {list(shape)}")
    return run(MHC_PRE_APPLY_MIX_BACKWARD, MhcInputs((o_grad, x, mix)))


def _post_args(op: str, x, residual, post_layer_mix, comb_res_mix):
    residual = tensor(op, "residual", residual, BF16, None, None, "pass the residual streams as bf16 [..., M, H]",
                      min_dim=2)
    lead, (m, h), dev = tuple(residual.shape[:-2]), residual.shape[-2:], residual.device
    x = tensor(op, "x", x, BF16, (*lead, h), dev, f"pass the layer output as bf16 [..., {h}]")
    post_layer_mix = tensor(op, "post_layer_mix", post_layer_mix, F32, (*lead, m, 1), dev,
                            f"pass the fp32 post mix [..., {m}, 1]")
    comb_res_mix = tensor(op, "comb_res_mix", comb_res_mix, F32, (*lead, m, m), dev,
                          f"pass the fp32 combination matrices [..., {m}, {m}]")
    return x, residual, post_layer_mix, comb_res_mix


@public_op(MHC_POST)
def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
             comb_res_mix: torch.Tensor) -> torch.Tensor:
    """The next residual streams, bf16 [..., M, H] (module docstring)."""
    if is_compiling():
        return compiled_call("mhc_post", x, residual, post_layer_mix, comb_res_mix)
    args = _post_args(MHC_POST.name, x, residual, post_layer_mix, comb_res_mix)
    return run(MHC_POST, MhcInputs(args))


@public_op(MHC_POST_BACKWARD)
def mhc_post_backward(d_out: torch.Tensor, x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                      comb_res_mix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """d_out bf16 [..., M, H] -> (d_x bf16, d_residual bf16, d_post_layer_mix fp32, d_comb_res_mix fp32)."""
    if is_compiling():
        return compiled_call("mhc_post_backward", d_out, x, residual, post_layer_mix, comb_res_mix)
    op = MHC_POST_BACKWARD.name
    args = _post_args(op, x, residual, post_layer_mix, comb_res_mix)
    d_out = tensor(op, "d_out", d_out, BF16, tuple(args[1].shape), args[1].device,
                   "pass the bf16 gradient of the output (the residual's shape)")
    return run(MHC_POST_BACKWARD, MhcInputs((d_out, *args)))


__all__ = ["mhc_pre_apply_mix", "mhc_pre_apply_mix_backward", "mhc_post", "mhc_post_backward",
           "pre_apply_mix_reference", "pre_apply_mix_backward_reference", "post_reference", "post_backward_reference"]
