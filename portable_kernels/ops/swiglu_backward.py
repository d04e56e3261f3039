"""`swiglu_backward_and_per_token_cast`: TileKernels' SwiGLU backward pass of a routed MoE expert,
with the input gradient also cast to FP8 per token (its name and argument order).

Contract (TileKernels' `quant.swiglu_backward_and_per_token_cast`, its torch oracle
`torch.swiglu_backward` + `torch.cast`): x is the forward input, FP8 e4m3 [M, 2H] with fp32 scales
per (1, num_per_channels) block (H % num_per_channels == 0), gate = the first half, up = the
second, dequantized as data · sf in fp32. With swiglu_clamp_value c (fp32): gate > c becomes c,
up is clamped to [-c, c]. Row r's weight w is weight.flatten()[pos_to_token_topk[r]] (0 when that
is -1). In fp32, each step rounded as written:
  t = 1 + exp(-gate) (torch's exp), s = 1 / t, ws = grad_out · w · s,
  gate_grad = ws · up · fma(gate, 1 - s, 1) (one rounding, as TileKernels' kernel), 0 where gate
  was clamped; up_grad = ws · gate, 0 where up was clamped;
  act = gate / t · up, out = act · w (bf16);
  x_grad = [gate_grad, up_grad] (bf16), and the same fp32 values cast to e4m3 per
  (1, num_per_channels) by TileKernels' rule (block_cast: x · (448 / amax), amax >= 1e-4;
  round_sf: power-of-two scales, x · (1 / sf));
  weight_grad [T, K] fp32: slot pos_to_token_topk[r] gets Σ_h grad_out · act (fp32, torch's
  summation order; within 1e-4 of any order), every other slot 0 (TileKernels leaves slots that
  no row and no -1 of token_topk_to_pos names unwritten).
pos_to_token_topk: int32 [M] in [-1, T·K), each slot at most once; token_topk_to_pos: int32 [T, K]
in [-1, M) (read for its shape only: the slots it marks -1 are the ones no row names).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from ..core.checks import check_bool, check_int
from ..core.compiled import compiled_call, is_compiling
from ..core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ..core.dispatch import run
from ..core.errors import ContractError, format_problem
from ..core.providers import Inputs
from ..core.tensors import FP8_DTYPE, describe
from ..layouts.errors import LayoutConversionError
from .quant.block_cast import DEFAULT_CLAMP_MIN, block_cast_reference

OP = "swiglu_backward_and_per_token_cast"


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    """a · b + c rounded once to fp32 (a, b fp32): the product is exact in fp64, the sum's rounding
    error is recovered by TwoSum, and a sum that lands exactly on an fp32 rounding midpoint is moved
    one fp64 ulp toward the true value before the final round to nearest even."""
    p = a.double() * b.double()
    cd = torch.full_like(p, c)
    s = p + cd
    bb = s - p
    err = (p - (s - bb)) + (cd - bb)
    _, ex = torch.frexp(s)
    ulp_exp = torch.clamp(ex - 24, min=-149)  # exponent of s's fp32 ulp (subnormals: 2^-149)
    scaled = torch.ldexp(s, -ulp_exp.double())
    tie = ((scaled - scaled.floor()) == 0.5) & (err != 0)
    if bool(tie.any()):
        toward = torch.where(err > 0, torch.full_like(s, math.inf), torch.full_like(s, -math.inf))
        s = torch.where(tie, torch.nextafter(s, toward), s)
    return s.float()


def swiglu_backward_reference(x_data: torch.Tensor, x_sf: torch.Tensor, grad_out: torch.Tensor, weight: torch.Tensor,
                              pos_to_token_topk: torch.Tensor, token_topk_to_pos: torch.Tensor,
                              num_per_channels: int, round_sf: bool, swiglu_clamp_value: float | None
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference math (module docstring) -> (out bf16 [M, H], x_grad_fp8 e4m3 [M, 2H], x_grad_sf fp32
    [M, 2H / n], x_grad bf16 [M, 2H], weight_grad fp32 [T, K])."""
    m, two_h = x_data.shape
    h = two_h // 2
    x = x_data.float() * x_sf.repeat_interleave(num_per_channels, dim=1)
    gate, up = x[:, :h], x[:, h:]
    clamped_gate = clamped_up = None
    if swiglu_clamp_value is not None:
        c = torch.tensor(swiglu_clamp_value, dtype=torch.float32, device=x.device)
        clamped_gate = gate > c
        hi, lo = up > c, up < -c
        clamped_up = hi | lo
        gate = torch.where(clamped_gate, c, gate)
        up = torch.where(lo, -c, torch.where(hi, c, up))
    t = 1.0 + torch.exp(-gate)
    s = torch.ones_like(gate) / t
    valid = pos_to_token_topk >= 0
    slot = pos_to_token_topk.clamp(min=0).long()
    w = torch.where(valid, weight.flatten()[slot], torch.zeros((), device=x.device))
    g = grad_out.float()
    ws = g * w[:, None] * s
    gate_grad = ws * up * fma_f32(gate, 1.0 - s, 1.0)
    up_grad = ws * gate
    if clamped_gate is not None:
        gate_grad = torch.where(clamped_gate, torch.zeros((), device=x.device), gate_grad)
        up_grad = torch.where(clamped_up, torch.zeros((), device=x.device), up_grad)
    act = gate / t * up
    out = act * w[:, None]
    x_grad = torch.cat([gate_grad, up_grad], dim=1)
    data, sf = block_cast_reference(x_grad, (1, num_per_channels), "e4m3", round_sf, DEFAULT_CLAMP_MIN["e4m3"])
    weight_grad = torch.zeros_like(weight)
    dots = (g * act).sum(dim=1)
    weight_grad.view(-1)[slot[valid]] = dots[valid]
    return (out.to(torch.bfloat16), data.contiguous(), sf.contiguous(), x_grad.to(torch.bfloat16), weight_grad)


@attrs.frozen
class SwigluBackwardInputs(Inputs):
    """One swiglu_backward_and_per_token_cast call (validated, contiguous): x_data e4m3 [M, 2H], x_sf
    fp32 [M, 2H / n], grad_out bf16 [M, H], weight fp32 [T, K], pos_to_token_topk int32 [M],
    token_topk_to_pos int32 [T, K], n, round_sf, the clamp (None or > 0). A provider returns what
    `swiglu_backward_reference` returns."""

    x_data: torch.Tensor
    x_sf: torch.Tensor
    grad_out: torch.Tensor
    weight: torch.Tensor
    pos_to_token_topk: torch.Tensor
    token_topk_to_pos: torch.Tensor
    num_per_channels: int
    round_sf: bool
    swiglu_clamp_value: float | None
    device_field = "x_data"

    def dims(self) -> dict[str, int]:
        return {"M": self.x_data.shape[0], "H": self.x_data.shape[1] // 2, "n": self.num_per_channels}


def swiglu_backward_kernel(call: SwigluBackwardInputs):
    try:
        return swiglu_backward_reference(call.x_data, call.x_sf, call.grad_out, call.weight, call.pos_to_token_topk,
                                         call.token_topk_to_pos, call.num_per_channels, call.round_sf,
                                         call.swiglu_clamp_value)
    except LayoutConversionError as exc:  # a NaN/Inf gradient cannot get a power-of-two scale
        raise ContractError(format_problem(OP, "x_data", "giving a NaN/Inf gradient (round_sf=True)",
                                           "inputs whose gradient is finite", "clean the inputs, or pass "
                                           "round_sf=False (NaN/Inf then propagate)")) from exc


SWIGLU_BACKWARD = register_contract(OpContract(
    OP, swiglu_backward_reference, Tolerance(dequantized=1e-5, unquantized=1e-3), kernel=swiglu_backward_kernel))


def _tensor(arg: str, t: Any, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device, fix: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape or t.device != device:
        raise ContractError(format_problem(OP, arg, describe(t), f"a {dtype} tensor of shape {list(shape)} on "
                                           f"{device}", fix))


def _check_values(pos_to_token_topk: torch.Tensor, token_topk_to_pos: torch.Tensor, m: int) -> None:
    if not checks_values(pos_to_token_topk, token_topk_to_pos):
        return
    slots = token_topk_to_pos.numel()
    if pos_to_token_topk.numel():
        bad = (pos_to_token_topk < -1) | (pos_to_token_topk >= slots)
        if bool(bad.any()):
            row = int(torch.nonzero(bad)[0])
            raise ContractError(format_problem(OP, "pos_to_token_topk", f"{int(pos_to_token_topk[row])} at row {row}",
                                               f"-1 (padding) or a slot in [0, {slots})",
                                               "pass the mapping get_fused_mapping built for this weight"))
        named = pos_to_token_topk[pos_to_token_topk >= 0]
        if named.numel() != torch.unique(named).numel():
            raise ContractError(format_problem(OP, "pos_to_token_topk", "naming a (token, topk) slot twice",
                                               "each slot at most once", "pass get_fused_mapping's mapping"))
    if slots:
        bad = (token_topk_to_pos < -1) | (token_topk_to_pos >= m)
        if bool(bad.any()):
            at = tuple(int(i) for i in torch.nonzero(bad)[0])
            raise ContractError(format_problem(OP, "token_topk_to_pos", f"{int(token_topk_to_pos[at])} at {at}",
                                               f"-1 or a row in [0, {m})", "pass get_fused_mapping's mapping"))


@public_op(SWIGLU_BACKWARD)
def swiglu_backward_and_per_token_cast(
        x_data: torch.Tensor, x_sf: torch.Tensor, grad_out: torch.Tensor, weight: torch.Tensor,
        pos_to_token_topk: torch.Tensor, token_topk_to_pos: torch.Tensor, num_per_channels: int,
        round_sf: bool = False, swiglu_clamp_value: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SwiGLU backward with the input gradient cast per token to FP8 (module docstring).

    x_data: e4m3 [M, 2H] (gate half first) with x_sf fp32 [M, 2H / num_per_channels];
    grad_out: bf16 [M, H] (gradient of the weighted activation); weight: fp32 [T, K] router
    weights; pos_to_token_topk: int32 [M] (-1 padding); token_topk_to_pos: int32 [T, K];
    num_per_channels: block width, H % num_per_channels == 0; round_sf: power-of-two scales;
    swiglu_clamp_value: None or c > 0, the forward's clamp.
    Returns (out bf16 [M, H], x_grad_fp8 e4m3 [M, 2H], x_grad_sf fp32 [M, 2H / n], x_grad bf16
    [M, 2H], weight_grad fp32 [T, K]).
    """
    if is_compiling():
        return compiled_call("swiglu_backward_and_per_token_cast", x_data, x_sf, grad_out, weight,
                             pos_to_token_topk, token_topk_to_pos, num_per_channels, round_sf, swiglu_clamp_value)
    if not isinstance(x_data, torch.Tensor) or x_data.dtype != FP8_DTYPE or x_data.dim() != 2 \
            or x_data.shape[1] % 2 or x_data.shape[1] == 0:
        raise ContractError(format_problem(OP, "x_data", describe(x_data), "an e4m3 tensor [M, 2H], H >= 1",
                                           "pass the FP8 forward input (gate half first)"))
    check_int(OP, "num_per_channels", num_per_channels, 1, fix="pass 128 or 32")
    m, two_h = x_data.shape
    h, device = two_h // 2, x_data.device
    if h % num_per_channels:
        raise ContractError(format_problem(OP, "num_per_channels", repr(num_per_channels), f"a divisor of H = {h}",
                                           "pass 128 or 32 (each half's blocks must not straddle the halves)"))
    check_bool(OP, "round_sf", round_sf)
    _tensor("x_sf", x_sf, torch.float32, (m, two_h // num_per_channels), device, "pass the scales of x_data")
    _tensor("grad_out", grad_out, torch.bfloat16, (m, h), device, "pass the bf16 gradient [M, H]")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ContractError(format_problem(OP, "weight", describe(weight), "an fp32 tensor [T, K]",
                                           "pass the router weights"))
    _tensor("weight", weight, torch.float32, tuple(weight.shape), device, "pass fp32 router weights")
    _tensor("token_topk_to_pos", token_topk_to_pos, torch.int32, tuple(weight.shape), device,
            "pass get_fused_mapping's token_topk_to_pos (same shape as weight)")
    _tensor("pos_to_token_topk", pos_to_token_topk, torch.int32, (m,), device,
            "pass get_fused_mapping's pos_to_token_topk (one entry per row of x_data)")
    if swiglu_clamp_value is not None and (isinstance(swiglu_clamp_value, bool)
                                           or not isinstance(swiglu_clamp_value, (int, float))
                                           or not math.isfinite(swiglu_clamp_value) or swiglu_clamp_value <= 0):
        raise ContractError(format_problem(OP, "swiglu_clamp_value", repr(swiglu_clamp_value),
                                           "None or a finite positive number", "pass e.g. 10.0"))
    _check_values(pos_to_token_topk, token_topk_to_pos, m)
    clamp = None if swiglu_clamp_value is None else float(swiglu_clamp_value)
    return run(SWIGLU_BACKWARD, SwigluBackwardInputs(
        x_data.contiguous(), x_sf.contiguous(), grad_out.contiguous(), weight.contiguous(),
        pos_to_token_topk.contiguous(), token_topk_to_pos.contiguous(), int(num_per_channels), round_sf, clamp))
