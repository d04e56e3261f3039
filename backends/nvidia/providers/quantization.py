"""nvidia providers of the quantizers (per_token_cast_to_fp8, per_block_cast_to_fp8,
per_channel_cast_to_fp8, per_token_cast_to_fp4, swiglu_forward_and_per_token_cast): Triton kernels
that write the scales in the consumer's Format directly (PLAIN, SM90 or SM100), so `prepare_for=`
converts nothing (per-channel scales are PLAIN only: their consumers take no prepared form)."""

from __future__ import annotations

from typing import Any

import torch

from portable_kernels.core.contract import checks_values
from portable_kernels.ops.quant.fp4 import PER_TOKEN_CAST_FP4
from portable_kernels.ops.swiglu import SWIGLU_CAST, SwigluCastInputs
from portable_kernels.layouts import PLAIN, SM90, SM100
from portable_kernels.ops.quant.fp8 import (PER_BLOCK_CAST, PER_CHANNEL_CAST, PER_TOKEN_CAST, CastInputs,
                                            nonfinite_ue8m0_error)
from portable_kernels.core.registry import Registry

from ._common import BACKEND, SCALE_FORM, TRITON, TRITON_PRIORITY, kernel, triton_devices, triton_reasons

#: largest block edge the cast kernels hold in one program (see kernels/cast_fp8.py)
MAX_BLOCK = 128
OUT_FORMATS = (PLAIN, SM90, SM100)


def _fp8_reasons(call: CastInputs) -> list[str]:
    gm, gk = call.granularity
    out = triton_reasons(call)
    if not (1 <= gm <= MAX_BLOCK and 1 <= gk <= MAX_BLOCK):
        out.append(f"block {call.granularity}: each edge must be at most {MAX_BLOCK}")
    if call.out_format is SM100 and not call.use_ue8m0:
        out.append("SM100 scales are exponents only: quantize with use_ue8m0=True")
    return out


def _channel_reasons(call: CastInputs) -> list[str]:
    gk = call.granularity[0]  # per channel: (gran_k rows, 1 column)
    out = triton_reasons(call)
    if not 1 <= gk <= MAX_BLOCK:
        out.append(f"gran_k {gk}: a block of at most {MAX_BLOCK} rows (one program holds it)")
    return out


def _fp4_reasons(call: CastInputs) -> list[str]:
    gk = call.granularity[1]
    out = _fp8_reasons(call)
    if gk % 2:
        out.append(f"gran_k {gk} must be even (two codes per byte)")
    return out


def _refuse_unscalable(op: str, use_ue8m0: bool, scale: torch.Tensor) -> None:
    """The contract's error for NaN/Inf input with power-of-two scales: the kernels give such a block
    a NaN scale (exponent byte 0xFF); found here from the small scale tensor, where values are read."""
    if not use_ue8m0 or scale.numel() == 0 or not checks_values(scale):
        return
    if scale.dtype == torch.int32:  # four exponent bytes per word (the storage is MN-major: no byte view)
        nan = any(bool((((scale >> shift) & 0xFF) == 0xFF).any()) for shift in (0, 8, 16, 24))
    else:
        nan = torch.isnan(scale).any()
    if bool(nan):
        raise nonfinite_ue8m0_error(op)


def _fp8_cast(call: CastInputs) -> Any:
    data, scale = kernel("cast_fp8").cast_to_fp8(call.x, tuple(call.granularity), call.use_ue8m0,
                                                 SCALE_FORM[call.out_format],
                                                 multiply_by_inverse=call.convention == "deep_gemm")
    _refuse_unscalable(PER_TOKEN_CAST.name if call.granularity[0] == 1 else PER_BLOCK_CAST.name, call.use_ue8m0,
                       scale)
    return data, scale


def _channel_cast(call: CastInputs) -> Any:
    data, scale = kernel("cast_fp8_channel").per_channel_cast_to_fp8(
        call.x, call.granularity[0], call.use_ue8m0, multiply_by_inverse=call.convention == "deep_gemm")
    _refuse_unscalable(PER_CHANNEL_CAST.name, call.use_ue8m0, scale)
    return data, scale


def _fp4_cast(call: CastInputs) -> Any:
    return kernel("cast_fp4").cast_to_fp4(call.x, call.granularity[1], call.use_ue8m0, SCALE_FORM[call.out_format],
                                          call.convention)


def _swiglu_reasons(call: SwigluCastInputs) -> list[str]:
    out = triton_reasons(call)
    if call.out_format is SM100 and not call.round_sf:
        out.append("SM100 scales are exponents only: pass round_sf=True")
    return out


def _swiglu_cast(call: SwigluCastInputs) -> Any:
    data, scale = kernel("swiglu_cast").swiglu_cast(call.x, call.num_per_channels, call.round_sf,
                                                    call.pos_to_token_topk, call.topk_weights, call.pos_to_expert,
                                                    call.swiglu_clamp_value, call.clamped_count,
                                                    SCALE_FORM[call.out_format])
    _refuse_unscalable(SWIGLU_CAST.name, call.round_sf, scale)
    return data, scale


def register(registry: Registry) -> None:
    formats = {"out_format": OUT_FORMATS}
    for contract in (PER_TOKEN_CAST, PER_BLOCK_CAST):
        registry.kernel(contract.name, BACKEND, TRITON, priority=TRITON_PRIORITY, formats=formats,
                        devices=triton_devices(), check=_fp8_reasons,
                        doc="Triton, writes PLAIN/SM90/SM100 scales directly")(_fp8_cast)
    registry.kernel(PER_CHANNEL_CAST.name, BACKEND, TRITON, priority=TRITON_PRIORITY,
                    formats={"out_format": (PLAIN,)}, devices=triton_devices(), check=_channel_reasons,
                    doc="Triton, one scale per (gran_k rows, 1 column), PLAIN scales")(_channel_cast)
    registry.kernel(PER_TOKEN_CAST_FP4.name, BACKEND, TRITON, priority=TRITON_PRIORITY, formats=formats,
                    devices=triton_devices(), check=_fp4_reasons,
                    doc="Triton, E2M1 in either convention, writes PLAIN/SM90/SM100 scales")(_fp4_cast)
    registry.kernel(SWIGLU_CAST.name, BACKEND, TRITON, priority=TRITON_PRIORITY, formats=formats,
                    devices=triton_devices(), check=_swiglu_reasons,
                    doc="Triton, SwiGLU and FP8 cast in one pass")(_swiglu_cast)
