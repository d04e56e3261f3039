"""Custom ops of the quantizers: per_token_cast_to_fp8, per_block_cast_to_fp8, per_token_cast_to_fp4,
swiglu_forward_and_per_token_cast, block_cast and per_token_cast_to_e5m6 (TileKernels' scale rule;
logical output only).

Each returns `(data, scale)`. Without a consumer (`prepare_for=""`) they are the logical pair (a
QuantTensor's tensors); with one, the bytes of the Format the selected backend stores that
argument in. The route fixes that (backend, Format, options) when torch.compile traces — the
`target_*` arguments — and rebuilds the PreparedTensor around the op's tensors; the
implementation refuses to return bytes of another backend or Format (empty target_backend:
no check, for direct callers). The fakes build the Format's storage with `fake_storage`.
swiglu_forward_and_per_token_cast adds into `clamped_count` when given (`Tensor(c!)?`). Schema,
route and implementation come from the public signatures (`declare.custom_op`: a quantizer's
`prepare_for, arg` cross as its consumer and the traced target); this module holds what the
signatures cannot say — the result values, the target check and the fakes' storage.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..ops import swiglu
from ..ops.quant import fp4, fp8 as quantization
from ..ops.quant.block_cast import block_cast as public_block_cast
from ..ops.quant.e5m6 import per_token_cast_to_e5m6
from ..core.contract import OpContract, get_contract
from ..core.formats import PLAIN, Format
from ..core.registry import select_backend
from ..core.tensors import FP8_DTYPE, PreparedTensor, QuantTensor
from .boundary import cast_target, check_ran_on, consumer_name, format_of, fresh, frozen_new, params_from_strs
from .declare import custom_op
from .fake_storage import fake_storage

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


def _value(contract: OpContract, outputs: tuple, x: torch.Tensor, prepare_for: Any, arg: str, shape: tuple,
           granularity: tuple, ue8m0: bool, element: str) -> QuantTensor | PreparedTensor:
    """A route's result: the op's (data, scale) in the QuantTensor or PreparedTensor the public
    function returns, with the consumer's (backend, Format, options) fixed at trace time."""
    data, scale = outputs
    consumer = consumer_name(prepare_for)
    if not consumer:
        return frozen_new(QuantTensor, data=data, scale=scale, granularity=granularity, ue8m0=ue8m0, element=element,
                          signature=("quant", granularity, ue8m0, element, data.device))
    backend, fmt_name, params = cast_target(contract.name, x.device, consumer, arg)
    fmt = format_of(fmt_name, contract.name, "prepare_for")
    params = params_from_strs(backend, list(params))
    ue8m0 = ue8m0 or fmt.requires_pow2
    return frozen_new(PreparedTensor, data=data, scale=scale, format=fmt, backend=backend, shape=shape,
                      granularity=granularity, storage_granularity=fmt.storage_granularity(granularity), ue8m0=ue8m0,
                      element=element, params=params,
                      signature=("prepared", backend, fmt.name, params, element, data.dtype, data.device))


def _outputs(op_name: str) -> Callable[..., tuple]:
    """The implementation's tensors of a quantizer with a consumer: checked against the traced target."""
    def outputs(value: QuantTensor | PreparedTensor, prepare_for: str, target_backend: str, target_format: str,
                target_params: list[str], **_: Any) -> tuple:
        return _result(op_name, value, prepare_for, (target_backend, target_format, *target_params))
    return outputs


def _quantizer(public: Callable[..., Any], fake: Callable[..., tuple], result: Callable[..., Any],
               **spec: Any) -> None:
    name = public.__pk_op__
    custom_op(public, returns="(Tensor data, Tensor scale)", fake=fake, outputs=_outputs(name), result=result,
              fresh_outputs=False, **spec)


def _quant(outputs: tuple, element: str, granularity: tuple, ue8m0: bool) -> QuantTensor:
    data, scale = outputs
    return frozen_new(QuantTensor, data=data, scale=scale, granularity=granularity, ue8m0=ue8m0, element=element,
                      signature=("quant", granularity, ue8m0, element, data.device))


# -- per_token_cast_to_fp8 / per_block_cast_to_fp8 / per_token_cast_to_fp4 ---------------------------

def _per_token_fake(x, gran_k, prepare_for, arg, target_format, **_):
    return _fake_pair("per_token_cast_to_fp8", x, x.shape, FP8_DTYPE, tuple(x.shape), (1, gran_k), prepare_for, arg,
                      target_format)


def _per_token_result(outputs, x, gran_k, use_ue8m0, prepare_for, arg, **_):
    return _value(quantization.PER_TOKEN_CAST, outputs, x, prepare_for, arg, tuple(x.shape), (1, gran_k), use_ue8m0,
                  "e4m3")


def _per_block_fake(x, block, prepare_for, arg, target_format, **_):
    return _fake_pair("per_block_cast_to_fp8", x, x.shape, FP8_DTYPE, tuple(x.shape), tuple(block), prepare_for, arg,
                      target_format)


def _per_block_result(outputs, x, block, use_ue8m0, prepare_for, arg, **_):
    return _value(quantization.PER_BLOCK_CAST, outputs, x, prepare_for, arg, tuple(x.shape), tuple(block), use_ue8m0,
                  "e4m3")


def _fp4_fake(x, gran_k, prepare_for, arg, target_format, **_):
    packed = (*x.shape[:-1], x.shape[-1] // 2)
    return _fake_pair("per_token_cast_to_fp4", x, packed, torch.uint8, tuple(x.shape), (1, gran_k), prepare_for, arg,
                      target_format)


def _fp4_result(outputs, x, gran_k, use_ue8m0, prepare_for, arg, **_):
    return _value(fp4.PER_TOKEN_CAST_FP4, outputs, x, prepare_for, arg, tuple(x.shape), (1, gran_k), use_ue8m0,
                  "e2m1")


# convention was appended to the published schemas, with its default
_quantizer(quantization.per_token_cast_to_fp8, _per_token_fake, _per_token_result, tail=("convention",))
_quantizer(quantization.per_block_cast_to_fp8, _per_block_fake, _per_block_result, tail=("convention",))
_quantizer(fp4.per_token_cast_to_fp4, _fp4_fake, _fp4_result, tail=("convention",))


# -- swiglu_forward_and_per_token_cast ------------------------------------------------------------

def _swiglu_fake(x, num_per_channels, prepare_for, arg, target_format, **_):
    shape = (x.shape[0], x.shape[1] // 2)
    return _fake_pair("swiglu_forward_and_per_token_cast", x, shape, FP8_DTYPE, shape, (1, num_per_channels),
                      prepare_for, arg, target_format)


def _swiglu_result(outputs, x, num_per_channels, round_sf, prepare_for, arg, **_):
    return _value(swiglu.SWIGLU_CAST, outputs, x, prepare_for, arg, (x.shape[0], x.shape[1] // 2), (1, num_per_channels),
                  round_sf, "e4m3")


_quantizer(swiglu.swiglu_forward_and_per_token_cast, _swiglu_fake, _swiglu_result, writes=("clamped_count",))


# -- per_channel_cast_to_fp8, block_cast (logical output only) ---------------------------------------

def _per_channel_fake(x, gran_k, **_):
    scale = (*x.shape[:-2], -(-x.shape[-2] // gran_k), x.shape[-1])
    return torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device), x.new_empty(scale, dtype=torch.float32)


custom_op(quantization.per_channel_cast_to_fp8, returns="(Tensor data, Tensor scale)", fake=_per_channel_fake,
          outputs=lambda value, **_: (value.data, value.scale),
          result=lambda outputs, gran_k, use_ue8m0, **_: _quant(outputs, "e4m3", (gran_k, 1), use_ue8m0))


def _block_cast_fake(x, fmt, block_size, **_):
    m, k = x.shape
    data = x.new_empty((m, k // 2) if fmt == "e2m1" else (m, k), dtype=torch.uint8 if fmt == "e2m1" else FP8_DTYPE)
    scale = x.new_empty((-(-m // block_size[0]), -(-k // block_size[1])), dtype=torch.float32)
    return data, scale


# with given scales a provider may return them as they are: the implementation copies them (fresh)
custom_op(public_block_cast, returns="(Tensor data, Tensor scale)", fake=_block_cast_fake,
          outputs=lambda value, **_: (value.data, value.scale),
          result=lambda outputs, fmt, block_size, round_sf, sf, **_: _quant(outputs, fmt, tuple(block_size),
                                                                             round_sf and sf is None))


def _e5m6_fake(x, num_per_channels, **_):
    m, k = x.shape
    return (x.new_empty((m, k // 8 * 12), dtype=torch.uint8),
            x.new_empty((m, -(-k // num_per_channels)), dtype=torch.float32))


custom_op(per_token_cast_to_e5m6, returns="(Tensor data, Tensor scale)", fake=_e5m6_fake)


from ..ops.quant.lossless import per_block_cast_lossless  # noqa: E402


def _lossless_fake(data, sf, x_block_size, out_block_size, **_):
    m, k = data.shape[0], data.shape[1] * 2
    return (data.new_empty((m, k), dtype=torch.float8_e4m3fn),
            data.new_empty((-(-m // out_block_size[0]), -(-k // out_block_size[1])), dtype=torch.float32))


custom_op(per_block_cast_lossless, returns="(Tensor data, Tensor scale)", fake=_lossless_fake)
