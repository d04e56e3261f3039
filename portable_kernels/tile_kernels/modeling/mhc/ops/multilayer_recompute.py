"""TileKernels' `modeling.mhc.ops.multilayer_recompute`: the activation recompute of several mHC
layers at once — layer_input[i] = pre_apply_mix(residual_i, pre_mix[i]) and residual_{i+1} =
post(layer_output[i], residual_i, post_mix[i], comb_mix[i]) — written into the caller's lists.
Here the portable pre_apply_mix and post ops run in turn (TileKernels fuses them in one kernel that
reads each residual once); the results are bit-identical to calling them one by one."""

from __future__ import annotations

import torch

from portable_kernels.core.checks import fail
from portable_kernels.ops.mhc.apply import mhc_post, mhc_pre_apply_mix

OP = "mhc_multilayer_recompute"


def mhc_multilayer_recompute(initial_residual: torch.Tensor, pre_mix_list: list[torch.Tensor],
                             layer_output_list: list[torch.Tensor], post_mix_list: list[torch.Tensor],
                             comb_mix_list: list[torch.Tensor], layer_input_list: list[torch.Tensor],
                             residual_list: list[torch.Tensor]) -> None:
    num_layers, num_post = len(pre_mix_list), len(layer_output_list)
    if num_layers == 0:
        fail(OP, "pre_mix_list", "empty", "one pre mix per layer (at least one)", "pass the layers' pre mixes")
    if len(layer_input_list) != num_layers:
        fail(OP, "layer_input_list", f"{len(layer_input_list)} tensors", f"{num_layers} (one per pre mix)",
             "allocate one bf16 [..., H] output per layer")
    if num_post not in (num_layers - 1, num_layers):
        fail(OP, "layer_output_list", f"{num_post} tensors", f"{num_layers - 1} or {num_layers}",
             "pass one layer output per post step")
    for name, lst in (("post_mix_list", post_mix_list), ("comb_mix_list", comb_mix_list),
                      ("residual_list", residual_list)):
        if len(lst) != num_post:
            fail(OP, name, f"{len(lst)} tensors", f"{num_post} (as layer_output_list)", f"pass {num_post}")
    residual = initial_residual
    for i in range(num_layers):
        layer_input_list[i].copy_(mhc_pre_apply_mix(residual, pre_mix_list[i]))
        if i < num_post:
            residual_list[i].copy_(mhc_post(layer_output_list[i], residual, post_mix_list[i], comb_mix_list[i]))
            residual = residual_list[i]


__all__ = ["mhc_multilayer_recompute"]
