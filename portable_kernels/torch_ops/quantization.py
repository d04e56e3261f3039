"""Custom ops of the quantizers: per_token_cast_to_fp8, per_block_cast_to_fp8, per_token_cast_to_fp4,
swiglu_forward_and_per_token_cast and block_cast (TileKernels' scale rule; logical output only).

Each returns `(data, scale)`. Without a consumer (`prepare_for=""`) they are the logical pair (a
QuantTensor's tensors); with one, the bytes of the Format the selected backend stores that
argument in. The route fixes that (backend, Format, options) when torch.compile traces — the
`target_*` arguments — and rebuilds the PreparedTensor around the op's tensors; the
implementation refuses to return bytes of another backend or Format (empty target_backend:
no check, for direct callers). The fakes build the Format's storage with `fake_storage`.
swiglu_forward_and_per_token_cast adds into `clamped_count` when given (`Tensor(c!)?`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..ops import swiglu
from ..ops.quant import fp4, fp8 as quantization
from ..ops.quant.block_cast import block_cast as public_block_cast
from ..core.compiled import ROUTES
from ..core.contract import OpContract, get_contract
from ..core.formats import PLAIN, Format
from ..core.registry import select_backend
from ..core.tensors import FP8_DTYPE, PreparedTensor, QuantTensor
from .boundary import (cast_target, check_ran_on, consumer_name, define, format_of, fresh, frozen_new, op,
                       params_from_strs)
from .fake_storage import fake_storage

#: the schema tail every quantizer shares: its consumer and the bytes the traced graph expects
_TARGET = "str prepare_for, str arg, str target_backend, str target_format, str[] target_params"


def _result(op_name: str, value: QuantTensor | PreparedTensor, prepare_for: str, target: tuple) -> tuple:
    """The op's (data, scale), after checking a prepared result is what the graph was traced for."""
    if prepare_for:
        check_ran_on(op_name, "the backend/Format of its result", tuple(target),
                     (value.backend, value.format.name, *[f"{k}={v}" for k, v in value.params]))
    if isinstance(value, QuantTensor) or value.format is PLAIN:
        return fresh((value.data, value.scale))
    return value.data, value.scale  # in the strides its Format defines (fake_storage builds the same)


def _target_format(op_name: str, x: torch.Tensor, prepare_for: str, arg: str, target_format: str) -> Format:
    """The Format a fake must build: the graph's expectation, else what selection says now."""
    if not prepare_for:
        return PLAIN
    if target_format:
        return format_of(target_format, op_name, "target_format")
    selection = select_backend(op_name, x.device, {})
    target = get_contract(prepare_for)
    return selection.backend.format_for(target.name, target.quant_arg(arg), selection.options)


def _fake_pair(op_name: str, x: torch.Tensor, data_shape: tuple, data_dtype: torch.dtype, shape: tuple,
               granularity: tuple, prepare_for: str, arg: str, target_format: str) -> tuple:
    data = torch.empty(data_shape, dtype=data_dtype, device=x.device)
    fmt = _target_format(op_name, x, prepare_for, arg, target_format)
    return fake_storage(fmt, data, shape, granularity)


def _rebuilt(contract: OpContract, x: torch.Tensor, prepare_for: Any, arg: str, call: Callable[..., tuple],
             shape: tuple, granularity: tuple, ue8m0: bool, element: str) -> QuantTensor | PreparedTensor:
    """A route's body: the consumer's bytes fixed at trace time, the op, the value rebuilt."""
    consumer = consumer_name(prepare_for)
    backend, fmt_name, params = cast_target(contract.name, x.device, consumer, arg)
    data, scale = call(consumer, arg, backend, fmt_name, list(params))
    if not consumer:
        return frozen_new(QuantTensor, data=data, scale=scale, granularity=granularity, ue8m0=ue8m0, element=element,
                          signature=("quant", granularity, ue8m0, element, data.device))
    fmt = format_of(fmt_name, contract.name, "prepare_for")
    params = params_from_strs(backend, list(params))
    ue8m0 = ue8m0 or fmt.requires_pow2
    return frozen_new(PreparedTensor, data=data, scale=scale, format=fmt, backend=backend, shape=shape,
                      granularity=granularity, storage_granularity=fmt.storage_granularity(granularity), ue8m0=ue8m0,
                      element=element, params=params,
                      signature=("prepared", backend, fmt.name, params, element, data.dtype, data.device))


def _kwargs(prepare_for: str, arg: str, convention: str | None = None) -> dict[str, Any]:
    kwargs = {"prepare_for": prepare_for or None, "arg": arg}
    return kwargs if convention is None else {**kwargs, "convention": convention}


# -- per_token_cast_to_fp8 / per_block_cast_to_fp8 ------------------------------------------------

def _per_token_impl(x, gran_k, use_ue8m0, prepare_for, arg, target_backend, target_format, target_params,
                    convention="portable"):
    value = quantization.per_token_cast_to_fp8(x, gran_k, use_ue8m0, **_kwargs(prepare_for, arg, convention))
    return _result("per_token_cast_to_fp8", value, prepare_for, (target_backend, target_format, *target_params))


def _per_token_fake(x, gran_k, use_ue8m0, prepare_for, arg, target_backend, target_format, target_params,
                    convention="portable"):
    return _fake_pair("per_token_cast_to_fp8", x, x.shape, FP8_DTYPE, tuple(x.shape), (1, gran_k), prepare_for, arg,
                      target_format)


define(f"per_token_cast_to_fp8(Tensor x, int gran_k, bool use_ue8m0, {_TARGET}, str convention='portable') "
       "-> (Tensor data, Tensor scale)",
       _per_token_impl, _per_token_fake)


def per_token_cast_to_fp8(x: torch.Tensor, gran_k: int = 128, use_ue8m0: bool = False, *,
                          prepare_for: Any = None, arg: str = "a",
                          convention: str = "portable") -> QuantTensor | PreparedTensor:
    return _rebuilt(quantization.PER_TOKEN_CAST, x, prepare_for, arg,
                    lambda *target: op("per_token_cast_to_fp8")(x, gran_k, use_ue8m0, *target, convention),
                    tuple(x.shape), (1, gran_k), use_ue8m0, "e4m3")


def _per_block_impl(x, block, use_ue8m0, prepare_for, arg, target_backend, target_format, target_params,
                    convention="portable"):
    value = quantization.per_block_cast_to_fp8(x, tuple(block), use_ue8m0, **_kwargs(prepare_for, arg, convention))
    return _result("per_block_cast_to_fp8", value, prepare_for, (target_backend, target_format, *target_params))


def _per_block_fake(x, block, use_ue8m0, prepare_for, arg, target_backend, target_format, target_params,
                    convention="portable"):
    return _fake_pair("per_block_cast_to_fp8", x, x.shape, FP8_DTYPE, tuple(x.shape), tuple(block), prepare_for, arg,
                      target_format)


define(f"per_block_cast_to_fp8(Tensor x, int[] block, bool use_ue8m0, {_TARGET}, str convention='portable') "
       "-> (Tensor data, Tensor scale)",
       _per_block_impl, _per_block_fake)


def per_block_cast_to_fp8(x: torch.Tensor, block: tuple[int, int] = (128, 128), use_ue8m0: bool = False, *,
                          prepare_for: Any = None, arg: str = "b",
                          convention: str = "portable") -> QuantTensor | PreparedTensor:
    granularity = tuple(block)
    return _rebuilt(quantization.PER_BLOCK_CAST, x, prepare_for, arg,
                    lambda *target: op("per_block_cast_to_fp8")(x, list(block), use_ue8m0, *target, convention),
                    tuple(x.shape), granularity, use_ue8m0, "e4m3")


# -- per_token_cast_to_fp4 ------------------------------------------------------------------------

def _fp4_impl(x, gran_k, use_ue8m0, prepare_for, arg, target_backend, target_format, target_params,
              convention="portable"):
    value = fp4.per_token_cast_to_fp4(x, gran_k, use_ue8m0, **_kwargs(prepare_for, arg, convention))
    return _result("per_token_cast_to_fp4", value, prepare_for, (target_backend, target_format, *target_params))


def _fp4_fake(x, gran_k, use_ue8m0, prepare_for, arg, target_backend, target_format, target_params,
              convention="portable"):
    packed = (*x.shape[:-1], x.shape[-1] // 2)
    return _fake_pair("per_token_cast_to_fp4", x, packed, torch.uint8, tuple(x.shape), (1, gran_k), prepare_for, arg,
                      target_format)


define(f"per_token_cast_to_fp4(Tensor x, int gran_k, bool use_ue8m0, {_TARGET}, str convention='portable') "
       "-> (Tensor data, Tensor scale)",
       _fp4_impl, _fp4_fake)


def per_token_cast_to_fp4(x: torch.Tensor, gran_k: int = 32, use_ue8m0: bool = True, *, prepare_for: Any = None,
                          arg: str = "b", convention: str = "portable") -> QuantTensor | PreparedTensor:
    return _rebuilt(fp4.PER_TOKEN_CAST_FP4, x, prepare_for, arg,
                    lambda *target: op("per_token_cast_to_fp4")(x, gran_k, use_ue8m0, *target, convention),
                    tuple(x.shape), (1, gran_k), use_ue8m0, "e2m1")


# -- per_channel_cast_to_fp8 (logical output only) ------------------------------------------------

def _per_channel_impl(x, gran_k, use_ue8m0, convention):
    value = quantization.per_channel_cast_to_fp8(x, gran_k, use_ue8m0, convention=convention)
    return fresh((value.data, value.scale), x)


def _per_channel_fake(x, gran_k, use_ue8m0, convention):
    scale = (*x.shape[:-2], -(-x.shape[-2] // gran_k), x.shape[-1])
    return torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device), x.new_empty(scale, dtype=torch.float32)


define("per_channel_cast_to_fp8(Tensor x, int gran_k, bool use_ue8m0, str convention) -> (Tensor data, Tensor scale)",
       _per_channel_impl, _per_channel_fake)


def per_channel_cast_to_fp8(x: torch.Tensor, gran_k: int = 128, use_ue8m0: bool = False, *,
                            convention: str = "portable") -> QuantTensor:
    data, scale = op("per_channel_cast_to_fp8")(x, gran_k, use_ue8m0, convention)
    granularity = (gran_k, 1)
    return frozen_new(QuantTensor, data=data, scale=scale, granularity=granularity, ue8m0=use_ue8m0, element="e4m3",
                      signature=("quant", granularity, use_ue8m0, "e4m3", data.device))


# -- swiglu_forward_and_per_token_cast ------------------------------------------------------------

def _swiglu_impl(x, fmt, num_per_channels, pos_to_token_topk, topk_weights, pos_to_expert,
                 use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, swiglu_clamp_value, clamped_count,
                 prepare_for, arg, target_backend, target_format, target_params):
    value = swiglu.swiglu_forward_and_per_token_cast(
        x, fmt, num_per_channels, pos_to_token_topk, topk_weights, pos_to_expert, use_tma_aligned_col_major_sf,
        round_sf, use_packed_ue8m0, swiglu_clamp_value, clamped_count, **_kwargs(prepare_for, arg))
    return _result("swiglu_forward_and_per_token_cast", value, prepare_for,
                   (target_backend, target_format, *target_params))


def _swiglu_fake(x, fmt, num_per_channels, pos_to_token_topk, topk_weights, pos_to_expert,
                 use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, swiglu_clamp_value, clamped_count,
                 prepare_for, arg, target_backend, target_format, target_params):
    shape = (x.shape[0], x.shape[1] // 2)
    return _fake_pair("swiglu_forward_and_per_token_cast", x, shape, FP8_DTYPE, shape, (1, num_per_channels),
                      prepare_for, arg, target_format)


define("swiglu_forward_and_per_token_cast(Tensor x, str fmt, int num_per_channels, Tensor? pos_to_token_topk, "
       "Tensor? topk_weights, Tensor? pos_to_expert, bool use_tma_aligned_col_major_sf, bool round_sf, "
       f"bool use_packed_ue8m0, float? swiglu_clamp_value, Tensor(c!)? clamped_count, {_TARGET}) "
       "-> (Tensor data, Tensor scale)", _swiglu_impl, _swiglu_fake)


def swiglu_forward_and_per_token_cast(
        x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128,
        pos_to_token_topk: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
        pos_to_expert: torch.Tensor | None = None, use_tma_aligned_col_major_sf: bool = False,
        round_sf: bool = False, use_packed_ue8m0: bool = False, swiglu_clamp_value: float | None = None,
        clamped_count: torch.Tensor | None = None, *, prepare_for: Any = None,
        arg: str = "a") -> QuantTensor | PreparedTensor:
    clamp = None if swiglu_clamp_value is None else float(swiglu_clamp_value)
    return _rebuilt(swiglu.SWIGLU_CAST, x, prepare_for, arg,
                    lambda *target: op("swiglu_forward_and_per_token_cast")(
                        x, fmt, num_per_channels, pos_to_token_topk, topk_weights, pos_to_expert,
                        use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp, clamped_count, *target),
                    (x.shape[0], x.shape[1] // 2), (1, num_per_channels), round_sf, "e4m3")


# -- block_cast -----------------------------------------------------------------------------------

def _block_cast_impl(x, fmt, block_size, round_sf, clamp_min, sf):
    value = public_block_cast(x, fmt, tuple(block_size), round_sf, clamp_min=clamp_min, sf=sf)
    return fresh((value.data, value.scale), x, sf)  # with given scales, a provider may return them as they are


def _block_cast_fake(x, fmt, block_size, round_sf, clamp_min, sf):
    m, k = x.shape
    data = x.new_empty((m, k // 2) if fmt == "e2m1" else (m, k), dtype=torch.uint8 if fmt == "e2m1" else FP8_DTYPE)
    scale = x.new_empty((-(-m // block_size[0]), -(-k // block_size[1])), dtype=torch.float32)
    return data, scale


define("block_cast(Tensor x, str fmt, int[] block_size, bool round_sf, float? clamp_min, Tensor? sf) "
       "-> (Tensor data, Tensor scale)", _block_cast_impl, _block_cast_fake)


def block_cast(x: torch.Tensor, fmt: str, block_size: tuple[int, int], round_sf: bool = False, *,
               clamp_min: float | None = None, sf: torch.Tensor | None = None) -> QuantTensor:
    data, scale = op("block_cast")(x, fmt, list(block_size), round_sf, clamp_min, sf)
    granularity, ue8m0 = tuple(block_size), round_sf and sf is None
    return frozen_new(QuantTensor, data=data, scale=scale, granularity=granularity, ue8m0=ue8m0, element=fmt,
                      signature=("quant", granularity, ue8m0, fmt, data.device))


ROUTES.update(block_cast=block_cast, per_token_cast_to_fp8=per_token_cast_to_fp8,
              per_channel_cast_to_fp8=per_channel_cast_to_fp8,
              per_block_cast_to_fp8=per_block_cast_to_fp8,
              per_token_cast_to_fp4=per_token_cast_to_fp4,
              swiglu_forward_and_per_token_cast=swiglu_forward_and_per_token_cast)
