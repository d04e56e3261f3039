"""Typed errors of the DeepSeek checkpoint path.

Each names the tensor (or config key) at fault and the fix, and subclasses the library's own
error classes so `except portable_kernels.errors.ContractError` / `LayoutError` catch them too.
"""

from __future__ import annotations

from ...core.errors import ContractError, LayoutError, PortableKernelsError


class CheckpointError(PortableKernelsError, ValueError):
    """A checkpoint directory cannot be read as a DeepSeek-V3 FP8 checkpoint."""


class UnsupportedConfigError(CheckpointError, ContractError):
    """config.json asks for something this model code does not implement."""


class MissingTensorError(CheckpointError):
    """A tensor the config requires is not in any shard."""


class UnexpectedTensorError(CheckpointError):
    """A shard holds a tensor this config has no place for."""


class TensorShapeError(CheckpointError, ContractError):
    """A tensor has the wrong shape for the config."""


class TensorDtypeError(CheckpointError, ContractError):
    """A tensor has the wrong dtype (FP8 weights must be float8_e4m3fn, scales float32)."""


class ScaleGridError(CheckpointError, ContractError):
    """A weight_scale_inv grid does not match its weight's [ceil(N/128), ceil(K/128)] blocks."""


class ScaleFormatError(CheckpointError, LayoutError):
    """Scales are not powers of two but the backend's Format stores UE8M0 exponents."""
