"""TileKernels' gradient hand-off between the mHC ops that read the same residual: `mhc_post`'s
backward leaves d_residual on the residual's storage as `grad_from_mhc_post`; `mhc_pre_apply_mix`
then adds its x gradient into that tensor and returns None, and `mhc_pre_norm_fn` (fuse_grad_acc)
adds its own and removes the attribute. Without the attribute both return their gradient."""

from __future__ import annotations

import torch

ATTR = "grad_from_mhc_post"


def pending(x: torch.Tensor) -> torch.Tensor | None:
    return getattr(x.untyped_storage(), ATTR, None)


def leave(x: torch.Tensor, grad: torch.Tensor) -> None:
    setattr(x.untyped_storage(), ATTR, grad)


def take(x: torch.Tensor) -> None:
    storage = x.untyped_storage()
    if hasattr(storage, ATTR):
        delattr(storage, ATTR)
