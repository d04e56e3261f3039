"""The mixing coefficients of an mHC layer from the projected mixes, and their backwards:
TileKernels' `mhc_pre_split_mixes` (per block: pre, post and residual-combination mixes) and
`mhc_head_compute_mix` (the final head's single mix). fp32 throughout.

pre_split_mixes, input_mixes [A, B, M3] with M3 = 2M + M², scale [3], base [M3]:
  z = input_mixes · s + base, s = [scale[0]]·M ++ [scale[1]]·M ++ [scale[2]]·M²
  pre  = sigmoid(z[:, :, :M]) + pre_eps            -> [A, B, M, 1]
  post = sigmoid(z[:, :, M:2M]) · post_mult_value  -> [A, B, M, 1]
  comb = z[:, :, 2M:]                              -> [A, B, M, M] (row-major)
Backward: dz = (d_pre · σ(1-σ), d_post · post_mult_value · σ(1-σ), d_comb); d_input = dz · s,
d_scale[i] = Σ over tokens and section i of dz · input_mixes, d_base = Σ_tokens dz.

head_compute_mix, input_mix [A, B, M], scale [1], base [M]:
  out = sigmoid(input_mix · scale + base) + pre_eps
Backward: dz = d_out · σ(1-σ); d_input = dz · scale, d_scale = Σ dz · input_mix, d_base = Σ_tokens dz.
"""

from __future__ import annotations

import torch

from ...core.checks import check_int, fail
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ._common import MhcInputs, number, tensor

TOLERANCE = 1e-9
F32 = (torch.float32,)


def _scale_vector(scale: torch.Tensor, m: int) -> torch.Tensor:
    return torch.cat([scale[0].expand(m), scale[1].expand(m), scale[2].expand(m * m)])


def pre_split_mixes_reference(input_mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, mhc_mult: int,
                              post_mult_value: float, pre_eps: float
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m = mhc_mult
    a, b = input_mixes.shape[:2]
    z = input_mixes * _scale_vector(scale, m) + base
    pre = torch.sigmoid(z[..., :m]) + pre_eps
    post = torch.sigmoid(z[..., m:2 * m]) * post_mult_value
    comb = z[..., 2 * m:].reshape(a, b, m, m)
    return pre.unsqueeze(-1).contiguous(), post.unsqueeze(-1).contiguous(), comb.contiguous()


def pre_split_mixes_backward_reference(pre_grad: torch.Tensor, post_grad: torch.Tensor, comb_grad: torch.Tensor,
                                       input_mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                                       mhc_mult: int, post_mult_value: float
                                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m = mhc_mult
    a, b, m3 = input_mixes.shape
    s = _scale_vector(scale, m)
    z = input_mixes * s + base
    sig_pre, sig_post = torch.sigmoid(z[..., :m]), torch.sigmoid(z[..., m:2 * m])
    dz = torch.cat([pre_grad.reshape(a, b, m) * sig_pre * (1 - sig_pre),
                    post_grad.reshape(a, b, m) * post_mult_value * sig_post * (1 - sig_post),
                    comb_grad.reshape(a, b, m * m)], dim=-1)
    prod = (dz * input_mixes).reshape(-1, m3).sum(0)
    d_scale = torch.stack([prod[:m].sum(), prod[m:2 * m].sum(), prod[2 * m:].sum()])
    return (dz * s).contiguous(), d_scale, dz.reshape(-1, m3).sum(0)


def head_compute_mix_reference(input_mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                               pre_eps: float) -> torch.Tensor:
    return torch.sigmoid(input_mix * scale + base) + pre_eps


def head_compute_mix_backward_reference(out_grad: torch.Tensor, input_mix: torch.Tensor, scale: torch.Tensor,
                                        base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m = input_mix.shape[-1]
    sig = torch.sigmoid(input_mix * scale + base)
    dz = out_grad * sig * (1 - sig)
    return (dz * scale).contiguous(), (dz * input_mix).sum().reshape(1), dz.reshape(-1, m).sum(0)


MHC_PRE_SPLIT_MIXES = register_contract(OpContract(
    "mhc_pre_split_mixes", pre_split_mixes_reference, Tolerance(dequantized=TOLERANCE),
    kernel=lambda call: pre_split_mixes_reference(*call.tensors, *call.params)))
MHC_PRE_SPLIT_MIXES_BACKWARD = register_contract(OpContract(
    "mhc_pre_split_mixes_backward", pre_split_mixes_backward_reference, Tolerance(dequantized=TOLERANCE),
    kernel=lambda call: pre_split_mixes_backward_reference(*call.tensors, *call.params)))
MHC_HEAD_COMPUTE_MIX = register_contract(OpContract(
    "mhc_head_compute_mix", head_compute_mix_reference, Tolerance(dequantized=TOLERANCE),
    kernel=lambda call: head_compute_mix_reference(*call.tensors, *call.params)))
MHC_HEAD_COMPUTE_MIX_BACKWARD = register_contract(OpContract(
    "mhc_head_compute_mix_backward", head_compute_mix_backward_reference, Tolerance(dequantized=TOLERANCE),
    kernel=lambda call: head_compute_mix_backward_reference(*call.tensors)))


def _split_args(op: str, input_mixes, scale, base, mhc_mult):
    check_int(op, "mhc_mult", mhc_mult, 1, fix="pass the number of residual streams (4 in DeepSeek-V4)")
    m3 = mhc_mult * (mhc_mult + 2)
    input_mixes = tensor(op, "input_mixes", input_mixes, F32, (None, None, m3), None,
                         f"pass the projected mixes as fp32 [A, B, {m3}] (2M + M² for mhc_mult = {mhc_mult})")
    dev = input_mixes.device
    scale = tensor(op, "scale", scale, F32, (3,), dev, "pass the three fp32 scales (pre, post, comb)")
    base = tensor(op, "base", base, F32, (m3,), dev, f"pass the fp32 biases [{m3}]")
    return input_mixes, scale, base


@public_op(MHC_PRE_SPLIT_MIXES)
def mhc_pre_split_mixes(input_mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, mhc_mult: int,
                        post_mult_value: float, pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_mixes fp32 [A, B, 2M + M²], scale fp32 [3], base fp32 [2M + M²] -> (pre [A, B, M, 1],
    post [A, B, M, 1], comb [A, B, M, M]), all fp32 (module docstring)."""
    if is_compiling():
        return compiled_call("mhc_pre_split_mixes", input_mixes, scale, base, mhc_mult, post_mult_value, pre_eps)
    op = MHC_PRE_SPLIT_MIXES.name
    input_mixes, scale, base = _split_args(op, input_mixes, scale, base, mhc_mult)
    pmv = number(op, "post_mult_value", post_mult_value)
    eps = number(op, "pre_eps", pre_eps)
    return run(MHC_PRE_SPLIT_MIXES, MhcInputs((input_mixes, scale, base), (int(mhc_mult), pmv, eps)))


@public_op(MHC_PRE_SPLIT_MIXES_BACKWARD)
def mhc_pre_split_mixes_backward(pre_grad: torch.Tensor, post_grad: torch.Tensor, comb_grad: torch.Tensor,
                                 input_mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, mhc_mult: int,
                                 post_mult_value: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of (pre, post, comb) -> (input_mixes_grad [A, B, M3], scale_grad [3],
    base_grad [M3]), fp32; the forward's inputs are passed again (module docstring)."""
    if is_compiling():
        return compiled_call("mhc_pre_split_mixes_backward", pre_grad, post_grad, comb_grad, input_mixes, scale,
                             base, mhc_mult, post_mult_value)
    op = MHC_PRE_SPLIT_MIXES_BACKWARD.name
    input_mixes, scale, base = _split_args(op, input_mixes, scale, base, mhc_mult)
    a, b, _ = input_mixes.shape
    m, dev = int(mhc_mult), input_mixes.device
    pre_grad = tensor(op, "pre_grad", pre_grad, F32, (a, b, m, 1), dev, "pass the fp32 gradient of pre_layer_mix")
    post_grad = tensor(op, "post_grad", post_grad, F32, (a, b, m, 1), dev,
                       "pass the fp32 gradient of post_layer_mix")
    comb_grad = tensor(op, "comb_grad", comb_grad, F32, (a, b, m, m), dev, "pass the fp32 gradient of comb_res_mix")
    pmv = number(op, "post_mult_value", post_mult_value)
    return run(MHC_PRE_SPLIT_MIXES_BACKWARD, MhcInputs((pre_grad, post_grad, comb_grad, input_mixes, scale, base),
                                                       (m, pmv)))


def _head_args(op: str, input_mix, scale, base):
    input_mix = tensor(op, "input_mix", input_mix, F32, (None, None, None), None,
                       "pass the head's mixes as fp32 [A, B, M]")
    m, dev = input_mix.shape[-1], input_mix.device
    scale = tensor(op, "scale", scale, F32, (1,), dev, "pass the fp32 scale as a 1-element tensor")
    base = tensor(op, "base", base, F32, (m,), dev, f"pass the fp32 biases [{m}]")
    if m == 0:
        fail(op, "input_mix", "with M = 0", "M >= 1", "pass one mix per residual stream")
    return input_mix, scale, base


@public_op(MHC_HEAD_COMPUTE_MIX)
def mhc_head_compute_mix(input_mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                         pre_eps: float) -> torch.Tensor:
    """input_mix fp32 [A, B, M], scale fp32 [1], base fp32 [M] -> sigmoid(input_mix · scale + base) + pre_eps."""
    if is_compiling():
        return compiled_call("mhc_head_compute_mix", input_mix, scale, base, pre_eps)
    op = MHC_HEAD_COMPUTE_MIX.name
    input_mix, scale, base = _head_args(op, input_mix, scale, base)
    return run(MHC_HEAD_COMPUTE_MIX, MhcInputs((input_mix, scale, base), (number(op, "pre_eps", pre_eps),)))


@public_op(MHC_HEAD_COMPUTE_MIX_BACKWARD)
def mhc_head_compute_mix_backward(out_grad: torch.Tensor, input_mix: torch.Tensor, scale: torch.Tensor,
                                  base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The output's gradient -> (input_mix_grad [A, B, M], scale_grad [1], base_grad [M]), fp32."""
    if is_compiling():
        return compiled_call("mhc_head_compute_mix_backward", out_grad, input_mix, scale, base)
    op = MHC_HEAD_COMPUTE_MIX_BACKWARD.name
    input_mix, scale, base = _head_args(op, input_mix, scale, base)
    out_grad = tensor(op, "out_grad", out_grad, F32, tuple(input_mix.shape), input_mix.device,
                      "pass the output's fp32 gradient")
    return run(MHC_HEAD_COMPUTE_MIX_BACKWARD, MhcInputs((out_grad, input_mix, scale, base)))


__all__ = ["mhc_pre_split_mixes", "mhc_pre_split_mixes_backward", "mhc_head_compute_mix",
           "mhc_head_compute_mix_backward", "pre_split_mixes_reference", "pre_split_mixes_backward_reference",
           "head_compute_mix_reference", "head_compute_mix_backward_reference"]
