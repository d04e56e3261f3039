"""FP4 (E2M1) op family and the fused SwiGLU quantizer (DeepGEMM / TileKernels names).

`per_token_cast_to_fp4(x, gran_k=32, use_ue8m0=True)`: per (1, gran_k) block, amax clamped to
>= 1e-4, sf = amax / 6 (rounded up to a power of two when use_ue8m0), codes = E2M1 of x / sf
(round to nearest, ties to even, |x / sf| > 6 saturates) packed two per byte, even element low.
`fp8_fp4_gemm_nt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None)`: D = C + A·Bᵀ with an
FP8 per-token A and an FP4 per-(1, 32) B. `swiglu_forward_and_per_token_cast(x, ...)`: silu(gate)·up
with the gate in the FIRST half of x's last dim, then FP8 per-token quantization, in one op.
The rule kept: every byte format comes from portable_kernels.layouts (E2M1 codes, packing, scales).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs
import torch
import torch.nn.functional as F

from ...core.checks import check_bool, check_int
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, QuantArg, Tolerance, checks_values, public_op, quant_operand, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.formats import PLAIN, Format
from ..gemm.dense import GemmInputs, check_gemm_output, check_shared_k, fp8_gemm_nt_kernel, gemm_reference
from ...layouts.constants import FP4_E2M1_MAX, MX_BLOCK_K, SCALE_AMAX_FLOOR
from ...layouts.fp4 import e2m1_encode, e2m1_encode_ties_toward_zero, fp4_scale_from_amax, pack_e2m1
from ...core.packed_scales import is_packed_scale, packed_scale_operand
from ...core.providers import Inputs
from .fp8 import (FLOAT_INPUT_DTYPES, PLAIN_OUTPUT, CastInputs, check_convention, check_float_input, consumer,
                           quantize_blocks_reference, quantized_result, refusing_nonfinite_ue8m0, scale_blocks)
from ...core.tensors import PreparedTensor, QuantTensor, cdiv, describe

#: dtypes DeepGEMM-style raw FP4 tuples may carry their packed bytes in
PACKED_FP4_DTYPES = (torch.uint8, torch.int8, torch.float4_e2m1fn_x2)
#: K granularities of per-token scales the FP8×FP4 GEMM takes (DeepGEMM: 32 or 128)
FP8_FP4_GRAN_K = (MX_BLOCK_K, 128)
#: FP8 formats swiglu_forward_and_per_token_cast can produce (TileKernels' `fmt`)
SWIGLU_FORMATS = ("e4m3",)
#: clamped_count slots: gate > clamp, up > clamp, up < -clamp
CLAMP_COUNT_SLOTS = 3


# -- reference math --------------------------------------------------------------------------------


def quantize_fp4_reference(x: torch.Tensor, gran_k: int, use_ue8m0: bool,
                           convention: str = "portable") -> tuple[torch.Tensor, torch.Tensor]:
    """Reference math: x [..., M, K] (K even) -> (uint8 [..., M, K/2] packed E2M1, fp32 [..., M, ceil(K/gran_k)]).

    convention "portable": x / sf, codes round to nearest with ties to even, sign kept (-0 exists);
    "deep_gemm": x * (1/sf), codes by e2m1_encode_ties_toward_zero (ties toward zero, zero is +0).
    """
    *lead, mn, k = x.shape
    bk = cdiv(k, gran_k)
    blocks = F.pad(x.float(), (0, bk * gran_k - k)).view(*lead, mn, bk, gran_k)
    amax = blocks.abs().amax(dim=-1).clamp_min(SCALE_AMAX_FLOOR)
    scale = fp4_scale_from_amax(amax) if use_ue8m0 else amax / FP4_E2M1_MAX
    scaled = scale_blocks(blocks, scale[..., None], convention).view(*lead, mn, bk * gran_k)[..., :k]
    encode = e2m1_encode if convention == "portable" else e2m1_encode_ties_toward_zero
    return pack_e2m1(encode(scaled)), scale.contiguous()


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


def fp4_cast_kernel(call: CastInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference kernel of per_token_cast_to_fp4: PLAIN output."""
    with refusing_nonfinite_ue8m0("per_token_cast_to_fp4"):
        return quantize_fp4_reference(call.x, call.granularity[1], call.use_ue8m0, call.convention)


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


PER_TOKEN_CAST_FP4 = register_contract(OpContract(
    "per_token_cast_to_fp4", quantize_fp4_reference, Tolerance(dequantized=0.0, unquantized=2e-2),
    kernel=fp4_cast_kernel, kernel_formats=PLAIN_OUTPUT))
FP8_FP4_GEMM_NT = register_contract(OpContract(
    "fp8_fp4_gemm_nt", gemm_reference, Tolerance(dequantized=1e-6, unquantized=1e-2),
    # b is the weight operand ("rhs"); its scales are per row (1, 32), as DeepGEMM's mixed recipes
    (QuantArg("a", "lhs", (1, 128)), QuantArg("b", "rhs", (1, MX_BLOCK_K))), fp8_gemm_nt_kernel))
SWIGLU_CAST = register_contract(OpContract(
    "swiglu_forward_and_per_token_cast", swiglu_forward_and_per_token_cast_reference,
    Tolerance(dequantized=1e-5, unquantized=1e-3), kernel=swiglu_forward_and_per_token_cast_kernel,
    kernel_formats=PLAIN_OUTPUT))


# -- shared checks ---------------------------------------------------------------------------------


def _check_finite_values(op: str, x: torch.Tensor) -> None:
    # Only where reading the data costs no device sync (contract.checks_values); NaN/Inf have no E2M1 code.
    if checks_values(x) and x.numel() and not bool(torch.isfinite(x).all()):
        raise ContractError(format_problem(op, "x", "a tensor with NaN or Inf values", "finite values",
                                           "E2M1 has no NaN/Inf code; clean the input before quantizing"))


# -- per_token_cast_to_fp4 -------------------------------------------------------------------------


@public_op(PER_TOKEN_CAST_FP4)
def per_token_cast_to_fp4(x: torch.Tensor, gran_k: int = MX_BLOCK_K, use_ue8m0: bool = True, *,
                          prepare_for: str | Callable[..., Any] | None = None,
                          arg: str = "b", convention: str = "portable") -> QuantTensor | PreparedTensor:
    """Quantize per token to FP4: x bf16/fp16/fp32 [..., M, K] (K even) ->
    QuantTensor(element "e2m1": uint8 [..., M, K/2], fp32 [..., M, ceil(K/gran_k)]), granularity (1, gran_k).

    Two E2M1 codes per byte, even element in the low nibble; sf = amax / 6, rounded up to a power of
    two when use_ue8m0 (the default: the SM100 and Ascend MX layouts store exponents only).
    Note the argument order: gran_k before use_ue8m0 (DeepGEMM's helper takes use_ue8m0 first), so
    pass both by keyword when porting. NaN/Inf inputs are refused (checked on CPU tensors).
    prepare_for / arg: as in per_token_cast_to_fp8; the default consumer argument is "b", the FP4
    weight of fp8_fp4_gemm_nt. convention: "portable" (x / sf, ties to even, sign kept) or
    "deep_gemm" (x * (1/sf), ties toward zero, zero is +0), see quantize_fp4_reference.
    """
    if is_compiling():
        return compiled_call("per_token_cast_to_fp4", x, gran_k, use_ue8m0, prepare_for=prepare_for, arg=arg,
                             convention=convention)
    op = PER_TOKEN_CAST_FP4.name
    check_float_input(op, x, 2, 3)
    if x.shape[-1] % 2:
        raise ContractError(format_problem(op, "x", f"of shape {tuple(x.shape)} (odd K = {x.shape[-1]})",
                                           "an even K (two FP4 codes per byte)", "pad K to an even length"))
    check_int(op, "gran_k", gran_k, 1, fix="pass e.g. gran_k=32 (keywords: per_token_cast_to_fp4(x, gran_k=32, "
                                           "use_ue8m0=True))")
    check_bool(op, "use_ue8m0", use_ue8m0)
    check_convention(op, convention)
    _check_finite_values(op, x)
    target = consumer(prepare_for, arg)
    return quantized_result(PER_TOKEN_CAST_FP4, lambda fmt: CastInputs(x, (1, gran_k), use_ue8m0, fmt, convention),
                            tuple(x.shape), (1, gran_k), use_ue8m0, "e2m1", target, arg)


# -- fp8_fp4_gemm_nt -------------------------------------------------------------------------------


def fp4_operand(contract: OpContract, arg: str, value: Any, dims: int = 2) -> QuantTensor | PreparedTensor:
    """The logical view of an FP4 argument; a raw DeepGEMM tuple (packed int8/uint8 [(G,) N, K/2],
    fp32 [(G,) N, ceil(K/gran_k)] or DeepGEMM's packed int32 UE8M0 scales) becomes a QuantTensor with
    element "e2m1" and gran_k read off the shapes; `dims` is 2, or 3 for grouped weights."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, torch.Tensor) for v in value)
            and value[0].dtype in PACKED_FP4_DTYPES):
        return quant_operand(contract, arg, value)
    data, scale = value
    if is_packed_scale(scale) and data.dim() == dims:
        return packed_scale_operand(contract.name, arg, data.view(torch.uint8), scale, "e2m1", (MX_BLOCK_K, 128))
    if data.dim() != dims or scale.dtype != torch.float32 or scale.dim() != dims \
            or tuple(scale.shape[:-1]) != tuple(data.shape[:-1]):
        lead = "[G, N, " if dims == 3 else "[N, "
        raise ContractError(format_problem(contract.name, arg, f"scale {describe(scale)} for data {describe(data)}",
                                           f"fp32 scales {lead}ceil(K/gran_k)] for packed data {lead}K/2]",
                                           "pass the logical fp32 scales of per_token_cast_to_fp4"))
    k = data.shape[-1] * 2
    gran_k = next((g for g in FP8_FP4_GRAN_K if cdiv(k, g) == scale.shape[-1]), None)
    if gran_k is None:
        raise ContractError(format_problem(contract.name, arg, f"scale of shape {tuple(scale.shape)} for K = {k}",
                                           f"ceil(K/gran_k) columns with gran_k in {FP8_FP4_GRAN_K}",
                                           "quantize with per_token_cast_to_fp4(w, gran_k=32)"))
    return QuantTensor(data.view(torch.uint8), scale, (1, gran_k), element="e2m1")


def check_recipes(op: str, a: QuantTensor | PreparedTensor, b: QuantTensor | PreparedTensor, recipe: Any,
                   recipe_a: Any, recipe_b: Any) -> None:
    ga, gb = tuple(a.granularity), tuple(b.granularity)
    if recipe is not None:
        if not (isinstance(recipe, (tuple, list)) and len(recipe) == 3) or ga[1] != gb[1] \
                or tuple(recipe) != (ga[0], gb[0], ga[1]):
            raise ContractError(format_problem(op, "recipe", repr(recipe),
                                               f"None (the operands' granularities a {ga}, b {gb})",
                                               "leave recipe=None, or assert each operand with recipe_a / recipe_b"))
    for arg, value, g in (("recipe_a", recipe_a, ga), ("recipe_b", recipe_b, gb)):
        if value is not None and (not isinstance(value, (tuple, list)) or tuple(value) != g):
            raise ContractError(format_problem(op, arg, repr(value), f"None or {g} (the operand's granularity)",
                                               "leave it None or quantize with the matching gran_k"))


def _check_fp8_fp4_operands(op: str, a: QuantTensor | PreparedTensor, b: QuantTensor | PreparedTensor) -> None:
    for arg, t, element, fix in (("a", a, "e4m3", "quantize with per_token_cast_to_fp8 (use fp4 only for b)"),
                                 ("b", b, "e2m1", "quantize with per_token_cast_to_fp4, or use fp8_gemm_nt")):
        if t.element != element:
            raise ContractError(format_problem(op, arg, f"{t.element} data", f"{element} data", fix))
        if len(t.shape) != 2:
            raise ContractError(format_problem(op, arg, f"of logical shape {tuple(t.shape)}", "2-D [rows, K]",
                                               "pass one matrix; the grouped FP4 GEMMs are not provided"))
        g = tuple(t.granularity)
        if g[0] != 1 or g[1] not in FP8_FP4_GRAN_K:
            raise ContractError(format_problem(op, arg, f"scaled per {g}",
                                               f"per-row scales (1, gran_k) with gran_k in {FP8_FP4_GRAN_K}",
                                               "quantize per token (per_token_cast_to_fp8 / per_token_cast_to_fp4)"))
    check_shared_k(op, a.shape, b.shape)
    if b.device != a.device:
        raise ContractError(format_problem(op, "b", f"on {b.device}", f"on {a.device} like a", "move b to a's device"))


@public_op(FP8_FP4_GEMM_NT)
def fp8_fp4_gemm_nt(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None,
                    recipe: tuple[int, ...] | None = None,
                    recipe_a: tuple[int, ...] | None = None, recipe_b: tuple[int, ...] | None = None) -> None:
    """D = C + A·Bᵀ with an FP8 activation and an FP4 weight, written into d.

    a: (fp8 [M, K], fp32 [M, ceil(K/128)]) — per-token FP8 (gran_k 128 or 32); a tuple, QuantTensor
       or PreparedTensor
    b: (uint8/int8 [N, K/2] packed E2M1, fp32 [N, ceil(K/32)]) — per_token_cast_to_fp4 output
       (gran_k 32 or 128); prepare weights once with prepare_inputs
    d: bf16 or fp32 [M, N], row-major; c: None or fp32 (or d's dtype) [M, N]
    recipe: must stay None unless both operands share one gran_k; recipe_a / recipe_b: None or the
       operand's (1, gran_k), asserted (DeepGEMM's mixed-precision recipes)
    """
    if is_compiling():
        return compiled_call("fp8_fp4_gemm_nt", a, b, d, c, recipe, recipe_a, recipe_b)
    op = FP8_FP4_GEMM_NT.name
    qa = quant_operand(FP8_FP4_GEMM_NT, "a", a)
    qb = fp4_operand(FP8_FP4_GEMM_NT, "b", b)
    _check_fp8_fp4_operands(op, qa, qb)
    check_recipes(op, qa, qb, recipe, recipe_a, recipe_b)
    check_gemm_output(op, d, c, (qa.shape[0], qb.shape[0]), qa.device)
    run(FP8_FP4_GEMM_NT, GemmInputs(qa, qb, d, c))


# -- swiglu_forward_and_per_token_cast ---------------------------------------------------------------


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
