"""Fake storage of each Format: the data and scale tensors (shape, dtype, strides, no values) a
Format's `encode` produces, for the fake implementations of quantizers asked for a consumer's bytes.

torch.compile traces ops on fake tensors, so a quantizer called with `prepare_for` must say what
its outputs will look like in the consumer's Format without running the encoder (the encoders read
values: the UE8M0 Formats check for powers of two). Each builder allocates exactly as its
encoder does, with the logical sizes only, so symbolic sizes work; `tests/core/test_custom_ops.py`
holds every builder to its encoder's output over a grid of shapes. A plugin that defines its own
Format registers a builder with `register_fake_storage` (else tracing such a quantizer call raises).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..core.errors import LayoutError
from ..core.formats import PLAIN, Format
from ..layouts import (ASCEND_BF16_VALUES, ASCEND_FP32_VALUES, ASCEND_MX, ASCEND_MX_KMAJOR, ASCEND_MX_NZ, MX_BLOCK_K,
                       SM90, SM100, nz_shape)

#: (plain data, logical shape, granularity as quantized) -> (stored data, stored scale)
StorageFn = Callable[[torch.Tensor, tuple, tuple], tuple[torch.Tensor, torch.Tensor]]

_BUILDERS: dict[str, StorageFn] = {}


def _cdiv(a, b):
    return -(-a // b)


def _align(a, b):
    return _cdiv(a, b) * b


def register_fake_storage(fmt: Format, fn: StorageFn) -> None:
    """Say what `fmt.encode` returns without running it: fn(plain data, logical shape, granularity)
    -> (data, scale) of the right shapes, dtypes and strides (values unspecified)."""
    _BUILDERS[fmt.name] = fn


def fake_storage(fmt: Format, data: torch.Tensor, shape: tuple,
                 granularity: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scale) as `fmt` stores an operand of logical `shape` quantized at `granularity`
    (`data` is its plain data; runs on fake tensors)."""
    builder = _BUILDERS.get(fmt.name)
    if builder is None:
        raise LayoutError(f"Format {fmt.name!r} has no fake storage, so torch.compile cannot trace a quantizer that "
                          f"emits it. Fix: register one with portable_kernels.torch_ops.register_fake_storage.")
    return builder(data, tuple(shape), tuple(granularity))


def _block_scale(data: torch.Tensor, shape: tuple, granularity: tuple) -> torch.Tensor:
    *lead, mn, k = shape
    return torch.empty((*lead, _cdiv(mn, granularity[0]), _cdiv(k, granularity[1])), dtype=torch.float32,
                       device=data.device)


def _nd(data: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty(data.shape, dtype=dtype or data.dtype, device=data.device)


def _mn_major(data: torch.Tensor, shape: tuple, words, mn_stride, dtype: torch.dtype) -> torch.Tensor:
    """Words [(G,) MN, words] stored MN-major with `mn_stride` (layouts.fp8_scales._mn_major_words)."""
    *lead, mn, _ = shape
    groups = lead[0] if lead else 1
    out = torch.empty((groups, words, mn_stride), dtype=dtype, device=data.device)[:, :, :mn].transpose(1, 2)
    return out if lead else out[0]


def _plain(data, shape, granularity):
    return _nd(data), _block_scale(data, shape, granularity)


def _sm90(data, shape, granularity):
    if granularity[0] != 1:  # 128x128 weight scales: K-major as is
        return _nd(data), _block_scale(data, shape, granularity)
    mn, k = shape[-2], shape[-1]
    return _nd(data), _mn_major(data, shape, _cdiv(k, granularity[1]), _align(mn, 4), torch.float32)


def _sm100(data, shape, granularity):
    mn, k = shape[-2], shape[-1]
    return _nd(data), _mn_major(data, shape, _cdiv(_cdiv(k, granularity[1]), 4), _align(mn, 4), torch.int32)


def _ascend_mx_scale(data, shape):
    mn, k = shape[-2], shape[-1]
    return _mn_major(data, shape, _cdiv(_cdiv(k, MX_BLOCK_K), 2), mn, torch.int16)


def _ascend_mx(data, shape, granularity):
    return _nd(data), _ascend_mx_scale(data, shape)


def _ascend_mx_nz(data, shape, granularity):
    *lead, mn, _ = shape
    tiles = torch.empty((*lead, *nz_shape(mn, data.shape[-1], data.dtype)), dtype=data.dtype, device=data.device)
    return tiles, _ascend_mx_scale(data, shape)


def _ascend_mx_kmajor(data, shape, granularity):
    *lead, mn, k = shape
    words = _cdiv(_cdiv(k, MX_BLOCK_K), 2)
    return _nd(data), torch.empty((*lead, mn, words, 2), dtype=torch.float8_e8m0fnu, device=data.device)


def _values(dtype: torch.dtype) -> StorageFn:
    def build(data, shape, granularity):
        return _nd(data, dtype), _block_scale(data, shape, granularity)
    return build


for _fmt, _fn in ((PLAIN, _plain), (SM90, _sm90), (SM100, _sm100), (ASCEND_MX, _ascend_mx),
                  (ASCEND_MX_NZ, _ascend_mx_nz), (ASCEND_MX_KMAJOR, _ascend_mx_kmajor),
                  (ASCEND_BF16_VALUES, _values(torch.bfloat16)), (ASCEND_FP32_VALUES, _values(torch.float32))):
    register_fake_storage(_fmt, _fn)
