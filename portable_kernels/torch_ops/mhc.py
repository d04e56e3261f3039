"""Custom ops of the mHC family (ops/mhc): every forward and backward op returns fresh tensors and
writes nothing. Schema, route and implementation come from the public signatures (`declare.custom_op`)."""

from __future__ import annotations

from typing import Any

import torch

from ..ops.mhc import apply, expand, mixes, norm_fn, sinkhorn
from .declare import custom_op


def _f32(t: torch.Tensor, *shape: int) -> torch.Tensor:
    return t.new_empty(shape, dtype=torch.float32)


def _bf16(t: torch.Tensor, *shape: int) -> torch.Tensor:
    return t.new_empty(shape, dtype=torch.bfloat16)


custom_op(expand.mhc_expand, returns="Tensor",
          fake=lambda hidden, mhc_mult, **_: hidden.new_empty((*hidden.shape[:-1], mhc_mult, hidden.shape[-1])))
custom_op(expand.mhc_expand_backward, returns="Tensor",
          fake=lambda out_grad, **_: out_grad.new_empty((*out_grad.shape[:-2], out_grad.shape[-1])))
custom_op(sinkhorn.mhc_sinkhorn, returns="Tensor", fake=lambda x, *_, **__: torch.empty_like(x))
custom_op(sinkhorn.mhc_sinkhorn_backward, returns="Tensor", fake=lambda grad, x, *_, **__: torch.empty_like(x))


def _split_fake(input_mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, mhc_mult: int, *_: Any,
                **__: Any) -> tuple[torch.Tensor, ...]:
    a, b, _m3 = input_mixes.shape
    return (_f32(input_mixes, a, b, mhc_mult, 1), _f32(input_mixes, a, b, mhc_mult, 1),
            _f32(input_mixes, a, b, mhc_mult, mhc_mult))


def _split_backward_fake(pre_grad: torch.Tensor, post_grad: torch.Tensor, comb_grad: torch.Tensor,
                         input_mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *_: Any, **__: Any
                         ) -> tuple[torch.Tensor, ...]:
    return torch.empty_like(input_mixes), torch.empty_like(scale), torch.empty_like(base)


custom_op(mixes.mhc_pre_split_mixes, returns="(Tensor pre_layer_mix, Tensor post_layer_mix, Tensor comb_res_mix)",
          fake=_split_fake)
custom_op(mixes.mhc_pre_split_mixes_backward,
          returns="(Tensor input_mixes_grad, Tensor scale_grad, Tensor base_grad)", fake=_split_backward_fake)
custom_op(mixes.mhc_head_compute_mix, returns="Tensor", fake=lambda input_mix, *_, **__: torch.empty_like(input_mix))
custom_op(mixes.mhc_head_compute_mix_backward,
          returns="(Tensor input_mix_grad, Tensor scale_grad, Tensor base_grad)",
          fake=lambda out_grad, input_mix, scale, base, **_: (torch.empty_like(input_mix), torch.empty_like(scale),
                                                              torch.empty_like(base)))
custom_op(apply.mhc_pre_apply_mix, returns="Tensor",
          fake=lambda x, mix, **_: _bf16(x, *x.shape[:-2], x.shape[-1]))
custom_op(apply.mhc_pre_apply_mix_backward, returns="(Tensor x_grad, Tensor mix_grad)",
          fake=lambda o_grad, x, mix, **_: (torch.empty_like(x), torch.empty_like(mix)))
custom_op(apply.mhc_post, returns="Tensor", fake=lambda x, residual, *_, **__: torch.empty_like(residual))
custom_op(apply.mhc_post_backward,
          returns="(Tensor d_x, Tensor d_residual, Tensor d_post_layer_mix, Tensor d_comb_res_mix)",
          fake=lambda d_out, x, residual, post_layer_mix, comb_res_mix, **_: (
              torch.empty_like(x), torch.empty_like(residual), torch.empty_like(post_layer_mix),
              torch.empty_like(comb_res_mix)))
custom_op(norm_fn.mhc_pre_norm_fn, returns="Tensor",
          fake=lambda residual, fn, *_, **__: _f32(residual, *residual.shape[:-2], fn.shape[0]))
custom_op(norm_fn.mhc_pre_norm_fn_backward, returns="(Tensor residual_grad, Tensor fn_grad)",
          fake=lambda out_grad, residual, fn, *_, **__: (torch.empty_like(residual), torch.empty_like(fn)))
