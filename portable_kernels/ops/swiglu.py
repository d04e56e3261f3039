"""SwiGLU, plain and fused with FP8 quantization (TileKernels / DeepGEMM names).

`swiglu_forward_and_per_token_cast(x, ...)`: silu(gate)·up with the gate in the FIRST half of x's
last dim, then FP8 per-token quantization, in one op. `swiglu_forward`: the same SwiGLU with
optional per-row routing weights, in fp32 — for callers that quantize with another rule or layout
(the tile_kernels module casts it with `block_cast`).

Contract: x [M, 2I], gate = x[:, :I] (first half), up = x[:, I:]; with swiglu_clamp_value c the
gate is clamped to <= c and up to [-c, c] first; y = silu(gate)·up (· topk_weights.flatten()
[pos_to_token_topk[r]] for row r) in fp32. Rows with pos_to_token_topk or pos_to_expert -1 are
padding and come back as zeros; clamped_count += (gate > c, up > c, up < -c) counted over the
other rows. Both ops share one SwiGLU math (`swiglu_reference`, `swiglu_rows`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs
import torch
import torch.nn.functional as F

from ..core.checks import check_bool, check_int
from ..core.compiled import compiled_call, is_compiling
from ..core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ..core.dispatch import run
from ..core.errors import ContractError, format_problem
from ..core.formats import PLAIN, Format
from ..core.providers import Inputs
from ..core.tensors import PreparedTensor, QuantTensor, describe
from .quant.fp8 import (FLOAT_INPUT_DTYPES, PLAIN_OUTPUT, consumer, quantize_blocks_reference, quantized_result,
                        refusing_nonfinite_ue8m0)

#: FP8 formats swiglu_forward_and_per_token_cast can produce (TileKernels' `fmt`)
SWIGLU_FORMATS = ("e4m3",)
#: clamped_count slots: gate > clamp, up > clamp, up < -clamp
CLAMP_COUNT_SLOTS = 3


def swiglu_reference(x: torch.Tensor, row_weight: torch.Tensor | None = None,
                     clamp: float | None = None) -> torch.Tensor:
    """silu(gate)·up (· row_weight): x [M, 2I] -> [M, I] in fp32 (fp64 for fp64 input).

    gate = x[:, :I] (the first half), up = x[:, I:]. With `clamp`, gate is clamped to <= clamp and
    up to [-clamp, clamp] before the product (TileKernels' swiglu_clamp_value).
    """
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    gate, up = x.to(dt).chunk(2, dim=-1)
    if clamp is not None:
        gate, up = gate.clamp(max=clamp), up.clamp(-clamp, clamp)
    out = F.silu(gate) * up
    return out if row_weight is None else out * row_weight.to(dt)[:, None]


def swiglu_rows(num_rows: int, pos_to_token_topk: torch.Tensor | None, topk_weights: torch.Tensor | None,
                pos_to_expert: torch.Tensor | None, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(valid [M] bool, per-row weight [M] or None): a row is padding when pos_to_expert or
    pos_to_token_topk is -1; row r's weight is topk_weights.flatten()[pos_to_token_topk[r]]."""
    valid = torch.ones(num_rows, dtype=torch.bool, device=device)
    if pos_to_expert is not None:
        valid &= pos_to_expert >= 0
    weight = None
    if pos_to_token_topk is not None and topk_weights is not None:
        valid &= pos_to_token_topk >= 0
        weight = topk_weights.flatten()[pos_to_token_topk.clamp(min=0).long()]
    return valid, weight


def swiglu_forward_and_per_token_cast_reference(
        x: torch.Tensor, num_per_channels: int, round_sf: bool, pos_to_token_topk: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None, pos_to_expert: torch.Tensor | None = None,
        swiglu_clamp_value: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference math: x [M, 2I] -> (fp8 [M, I], fp32 [M, ceil(I/num_per_channels)]); padding rows
    are quantized as zeros (data 0, the scale of an all-zero block)."""
    valid, weight = swiglu_rows(x.shape[0], pos_to_token_topk, topk_weights, pos_to_expert, x.device)
    out = swiglu_reference(x, weight, swiglu_clamp_value)
    out = torch.where(valid[:, None], out, out.new_zeros(()))
    return quantize_blocks_reference(out, 1, num_per_channels, round_sf)


def swiglu_clamp_counts(x: torch.Tensor, valid: torch.Tensor, clamp: float) -> torch.Tensor:
    """int64 [3]: over the valid rows, how many gate > clamp, up > clamp, up < -clamp."""
    gate, up = x[valid].float().chunk(2, dim=-1)
    return torch.stack([(gate > clamp).sum(), (up > clamp).sum(), (up < -clamp).sum()]).to(torch.int64)


@attrs.frozen
class SwigluCastInputs(Inputs):
    """One swiglu_forward_and_per_token_cast call (validated): x [M, 2I], the optional row mapping
    and weights, the clamp, clamped_count to add into, and the Format of the returned scales
    (PLAIN unless a provider emits a consumer's Format). A provider returns (data, scale storage)."""

    x: torch.Tensor
    num_per_channels: int
    round_sf: bool
    pos_to_token_topk: torch.Tensor | None
    topk_weights: torch.Tensor | None
    pos_to_expert: torch.Tensor | None
    swiglu_clamp_value: float | None
    clamped_count: torch.Tensor | None
    out_format: Format = PLAIN
    device_field = "x"

    def dims(self) -> dict[str, int]:
        m, two_i = self.x.shape
        return {"M": m, "I": two_i // 2}


def swiglu_forward_and_per_token_cast_kernel(call: SwigluCastInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference kernel: adds this call's clamp counts into clamped_count (when given), then quantizes."""
    if call.clamped_count is not None:
        valid, _ = swiglu_rows(call.x.shape[0], call.pos_to_token_topk, call.topk_weights, call.pos_to_expert,
                               call.x.device)
        call.clamped_count.add_(swiglu_clamp_counts(call.x, valid, call.swiglu_clamp_value))
    with refusing_nonfinite_ue8m0("swiglu_forward_and_per_token_cast"):
        return swiglu_forward_and_per_token_cast_reference(call.x, call.num_per_channels, call.round_sf,
                                                           call.pos_to_token_topk, call.topk_weights,
                                                           call.pos_to_expert, call.swiglu_clamp_value)


SWIGLU_CAST = register_contract(OpContract(
    "swiglu_forward_and_per_token_cast", swiglu_forward_and_per_token_cast_reference,
    Tolerance(dequantized=1e-5, unquantized=1e-3), kernel=swiglu_forward_and_per_token_cast_kernel,
    kernel_formats=PLAIN_OUTPUT))


def _check_optional_vector(op: str, arg: str, t: Any, rows: int, device: torch.device) -> None:
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != (rows,):
        raise ContractError(format_problem(op, arg, describe(t), f"None or an int32 tensor of shape [{rows}]",
                                           "pass the per-row mapping from get_fused_mapping (one entry per row of x)"))
    if t.device != device:
        raise ContractError(format_problem(op, arg, f"on {t.device}", f"on {device} like x",
                                           f"move {arg} to x's device"))


def _check_swiglu_args(op: str, x: Any, fmt: Any, num_per_channels: Any, pos_to_token_topk: Any, topk_weights: Any,
                       pos_to_expert: Any, use_tma_aligned_col_major_sf: Any, round_sf: Any, use_packed_ue8m0: Any,
                       swiglu_clamp_value: Any, clamped_count: Any) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_INPUT_DTYPES:
        raise ContractError(format_problem(op, "x", describe(x), f"a tensor of dtype {FLOAT_INPUT_DTYPES}",
                                           "pass the gate/up projection output in bf16 or fp32"))
    if x.dim() != 2 or x.shape[1] % 2 or x.shape[1] == 0:
        raise ContractError(format_problem(op, "x", f"of shape {tuple(x.shape)}", "2-D [M, 2I] with I >= 1",
                                           "pass [tokens, 2 * intermediate] with the gate half first"))
    if fmt not in SWIGLU_FORMATS:
        raise ContractError(format_problem(op, "fmt", repr(fmt), f"one of {SWIGLU_FORMATS}",
                                           "pass 'e4m3'; for FP4 call per_token_cast_to_fp4 on the activation"))
    check_int(op, "num_per_channels", num_per_channels, 1,
              fix="pass 128, or I (= x.shape[1] // 2) for one scale per row")
    for arg, value in (("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf),
                       ("use_packed_ue8m0", use_packed_ue8m0)):
        check_bool(op, arg, value)
        if value:
            raise ContractError(format_problem(op, arg, "True", "False (scales come back as logical fp32)",
                                               "pass prepare_for=<consuming op> to get that backend's scale bytes"))
    check_bool(op, "round_sf", round_sf)
    rows, device = x.shape[0], x.device
    _check_optional_vector(op, "pos_to_token_topk", pos_to_token_topk, rows, device)
    _check_optional_vector(op, "pos_to_expert", pos_to_expert, rows, device)
    if (pos_to_token_topk is None) != (topk_weights is None):
        missing = "topk_weights" if topk_weights is None else "pos_to_token_topk"
        raise ContractError(format_problem(op, missing, "None", "given together with the other weighting argument",
                                           "pass both pos_to_token_topk and topk_weights, or neither"))
    if topk_weights is not None:
        if not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32 or topk_weights.dim() != 2:
            raise ContractError(format_problem(op, "topk_weights", describe(topk_weights),
                                               "a float32 tensor [num_tokens, num_topk]", "pass the router weights"))
        if topk_weights.device != device:
            raise ContractError(format_problem(op, "topk_weights", f"on {topk_weights.device}", f"on {device} like x",
                                               "move topk_weights to x's device"))
    if swiglu_clamp_value is not None and (isinstance(swiglu_clamp_value, bool)
                                           or not isinstance(swiglu_clamp_value, (int, float))
                                           or not math.isfinite(swiglu_clamp_value) or swiglu_clamp_value <= 0):
        raise ContractError(format_problem(op, "swiglu_clamp_value", repr(swiglu_clamp_value),
                                           "None or a finite positive number", "pass e.g. 10.0"))
    if clamped_count is not None:
        if swiglu_clamp_value is None:
            raise ContractError(format_problem(op, "clamped_count", "given without swiglu_clamp_value",
                                               "None unless swiglu_clamp_value is set", "pass swiglu_clamp_value"))
        if not isinstance(clamped_count, torch.Tensor) or clamped_count.dtype != torch.int64 \
                or tuple(clamped_count.shape) != (CLAMP_COUNT_SLOTS,):
            raise ContractError(format_problem(op, "clamped_count", describe(clamped_count),
                                               f"an int64 tensor of shape [{CLAMP_COUNT_SLOTS}]",
                                               "pass torch.zeros(3, dtype=torch.int64)"))
        if clamped_count.device != device:
            raise ContractError(format_problem(op, "clamped_count", f"on {clamped_count.device}",
                                               f"on {device} like x", "move clamped_count to x's device"))


def _check_swiglu_values(op: str, pos_to_token_topk: torch.Tensor | None, topk_weights: torch.Tensor | None,
                         pos_to_expert: torch.Tensor | None) -> None:
    if pos_to_token_topk is not None and checks_values(pos_to_token_topk) and pos_to_token_topk.numel():
        limit = topk_weights.numel()
        bad = (pos_to_token_topk < -1) | (pos_to_token_topk >= limit)
        if bool(bad.any()):
            row = int(torch.nonzero(bad)[0])
            raise ContractError(format_problem(op, "pos_to_token_topk", f"{int(pos_to_token_topk[row])} at row {row}",
                                               f"-1 (padding) or a slot in [0, {limit}) of topk_weights",
                                               "pass the mapping built for these topk_weights"))
    if pos_to_expert is not None and checks_values(pos_to_expert) and pos_to_expert.numel():
        bad = pos_to_expert < -1
        if bool(bad.any()):
            row = int(torch.nonzero(bad)[0])
            raise ContractError(format_problem(op, "pos_to_expert", f"{int(pos_to_expert[row])} at row {row}",
                                               "-1 (padding) or an expert id >= 0", "pass get_fused_mapping's output"))


@public_op(SWIGLU_CAST)
def swiglu_forward_and_per_token_cast(
        x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128,
        pos_to_token_topk: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
        pos_to_expert: torch.Tensor | None = None, use_tma_aligned_col_major_sf: bool = False,
        round_sf: bool = False, use_packed_ue8m0: bool = False, swiglu_clamp_value: float | None = None,
        clamped_count: torch.Tensor | None = None, *, prepare_for: str | Callable[..., Any] | None = None,
        arg: str = "a") -> QuantTensor | PreparedTensor:
    """SwiGLU then FP8 per-token quantization in one op (TileKernels' name and argument order).

    x: bf16/fp16/fp32 [M, 2I]; gate = x[:, :I] (FIRST half), up = x[:, I:];
       y = silu(gate)·up (· weight of the row), quantized per (1, num_per_channels) like
       per_token_cast_to_fp8 (round_sf: power-of-two scales) ->
       QuantTensor(fp8 [M, I], fp32 [M, ceil(I/num_per_channels)])
    fmt: "e4m3" only
    pos_to_token_topk: None or int32 [M], row r's weight is topk_weights.flatten()[pos_to_token_topk[r]];
       given together with topk_weights: fp32 [num_tokens, num_topk]
    pos_to_expert: None or int32 [M]; rows with -1 (here or in pos_to_token_topk) are padding and come
       back as exact zeros (data 0, the all-zero block's scale)
    swiglu_clamp_value: None or c > 0: gate clamped to <= c, up to [-c, c] before the product;
       clamped_count: None or int64 [3] += counts of (gate > c, up > c, up < -c) over valid rows
    use_tma_aligned_col_major_sf / use_packed_ue8m0: must stay False — scale bytes are the backend's
       business: pass prepare_for=<op> (and arg, default "a") to get them already in that op's layout
    """
    if is_compiling():
        return compiled_call("swiglu_forward_and_per_token_cast", x, fmt, num_per_channels, pos_to_token_topk,
                             topk_weights, pos_to_expert, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                             swiglu_clamp_value, clamped_count, prepare_for=prepare_for, arg=arg)
    op = SWIGLU_CAST.name
    _check_swiglu_args(op, x, fmt, num_per_channels, pos_to_token_topk, topk_weights, pos_to_expert,
                       use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, swiglu_clamp_value, clamped_count)
    _check_swiglu_values(op, pos_to_token_topk, topk_weights, pos_to_expert)
    target = consumer(prepare_for, arg)
    clamp = None if swiglu_clamp_value is None else float(swiglu_clamp_value)

    def make(fmt: Format) -> SwigluCastInputs:
        return SwigluCastInputs(x, num_per_channels, round_sf, pos_to_token_topk, topk_weights, pos_to_expert, clamp,
                                clamped_count, fmt)

    return quantized_result(SWIGLU_CAST, make, (x.shape[0], x.shape[1] // 2), (1, num_per_channels), round_sf,
                            "e4m3", target, arg)


# -- swiglu_forward ---------------------------------------------------------------------------------


def swiglu_forward_reference(x: torch.Tensor, pos_to_token_topk: torch.Tensor | None = None,
                             topk_weights: torch.Tensor | None = None, pos_to_expert: torch.Tensor | None = None,
                             swiglu_clamp_value: float | None = None) -> torch.Tensor:
    """fp32 [M, I]: silu(gate)·up (· row weight), padding rows zero."""
    valid, weight = swiglu_rows(x.shape[0], pos_to_token_topk, topk_weights, pos_to_expert, x.device)
    out = swiglu_reference(x, weight, swiglu_clamp_value)
    return torch.where(valid[:, None], out, out.new_zeros(()))


@attrs.frozen
class SwigluForwardInputs(Inputs):
    """One swiglu_forward call (validated): x [M, 2I], the optional row mapping and weights, the clamp
    and clamped_count (int64 [3]) to add into. A provider returns fp32 [M, I]."""

    x: torch.Tensor
    pos_to_token_topk: torch.Tensor | None
    topk_weights: torch.Tensor | None
    pos_to_expert: torch.Tensor | None
    swiglu_clamp_value: float | None
    clamped_count: torch.Tensor | None
    device_field = "x"

    def dims(self) -> dict[str, int]:
        m, two_i = self.x.shape
        return {"M": m, "I": two_i // 2}


def swiglu_forward_kernel(call: SwigluForwardInputs) -> torch.Tensor:
    """Reference kernel: adds this call's clamp counts into clamped_count (when given), then the values."""
    if call.clamped_count is not None:
        valid, _ = swiglu_rows(call.x.shape[0], call.pos_to_token_topk, call.topk_weights, call.pos_to_expert,
                               call.x.device)
        call.clamped_count.add_(swiglu_clamp_counts(call.x, valid, call.swiglu_clamp_value))
    return swiglu_forward_reference(call.x, call.pos_to_token_topk, call.topk_weights, call.pos_to_expert,
                                    call.swiglu_clamp_value)


SWIGLU_FORWARD = register_contract(OpContract("swiglu_forward", swiglu_forward_reference,
                                              Tolerance(dequantized=1e-6), kernel=swiglu_forward_kernel))


@public_op(SWIGLU_FORWARD)
def swiglu_forward(x: torch.Tensor, pos_to_token_topk: torch.Tensor | None = None,
                   topk_weights: torch.Tensor | None = None, swiglu_clamp_value: float | None = None,
                   clamped_count: torch.Tensor | None = None, *,
                   pos_to_expert: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU in fp32 (TileKernels' `swiglu_forward` argument order); see the module docstring.

    x: bf16/fp16/fp32 [M, 2I], gate first; pos_to_token_topk: None or int32 [M], given together with
    topk_weights fp32 [num_tokens, num_topk]; swiglu_clamp_value: None or c > 0; clamped_count: None
    or int64 [3] (needs the clamp); pos_to_expert (keyword): None or int32 [M], -1 marks padding rows.
    Returns fp32 [M, I].
    """
    if is_compiling():
        return compiled_call("swiglu_forward", x, pos_to_token_topk, topk_weights, swiglu_clamp_value, clamped_count,
                             pos_to_expert=pos_to_expert)
    op = SWIGLU_FORWARD.name
    _check_swiglu_args(op, x, "e4m3", 1, pos_to_token_topk, topk_weights, pos_to_expert, False, False, False,
                       swiglu_clamp_value, clamped_count)
    _check_swiglu_values(op, pos_to_token_topk, topk_weights, pos_to_expert)
    clamp = None if swiglu_clamp_value is None else float(swiglu_clamp_value)
    return run(SWIGLU_FORWARD, SwigluForwardInputs(x, pos_to_token_topk, topk_weights, pos_to_expert, clamp,
                                                   clamped_count))
