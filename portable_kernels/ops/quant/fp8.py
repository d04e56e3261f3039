"""Quantization op family: FP8 casts with per-block scales, and dequantization.

Contract: for each block of (gran_mn x gran_k) elements, amax = max|x| clamped to >= 1e-4,
sf = amax / 448 (rounded up to a power of two when use_ue8m0), q = clamp(x / sf, ±448) as e4m3.
The division is the one documented choice ("portable" convention); convention="deep_gemm" instead
multiplies by the fp32 reciprocal 1/sf, as DeepGEMM's casts do, which differs from the division in
the last bit at some rounding ties when sf is not a power of two (with UE8M0 scales both agree).
Partial trailing blocks are allowed (K or MN not a multiple of the block). NaN/Inf inputs are not
checked (that would cost a pass over the data): they make their block's scale and values non-finite.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import attrs
import torch
import torch.nn.functional as F

from ...core.checks import check_bool, check_int
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, QuantArg, Tolerance, get_contract, public_op, quant_operand, register_contract
from ...core.dispatch import plan_for, run_plan
from ...core.errors import ContractError, format_problem
from ...core.formats import PLAIN, Format, as_quant
from ...layouts.constants import FP8_E4M3_MAX
from ...layouts.errors import LayoutConversionError
from ...layouts.fp8_scales import fp8_scale_from_amax
from ...core.prepare import backend_params, to_backend
from ...core.providers import Inputs
from ...core.tensors import FP8_DTYPE, PreparedTensor, QuantTensor, cdiv, describe

FLOAT_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


#: how a quantizer divides by its block scale (and, for FP4, rounds to codes): "portable" divides
#: by sf (FP4: ties to even, sign kept); "deep_gemm" multiplies by the fp32 reciprocal 1/sf (FP4:
#: ties toward zero, +0 for zero codes) — DeepGEMM's own casts, byte for byte
CONVENTIONS = ("portable", "deep_gemm")


def scale_blocks(blocks: torch.Tensor, scale: torch.Tensor, convention: str) -> torch.Tensor:
    """blocks / scale ("portable") or blocks * (1 / scale) ("deep_gemm"), in fp32."""
    return blocks / scale if convention == "portable" else blocks * (1.0 / scale)


def quantize_blocks_reference(x: torch.Tensor, gran_mn: int, gran_k: int, use_ue8m0: bool,
                              convention: str = "portable") -> tuple[torch.Tensor, torch.Tensor]:
    """Reference math: x [..., MN, K] -> (fp8 [..., MN, K], fp32 [..., ceil(MN/gran_mn), ceil(K/gran_k)])."""
    *lead, mn, k = x.shape
    bm, bk = cdiv(mn, gran_mn), cdiv(k, gran_k)
    padded = F.pad(x.float(), (0, bk * gran_k - k, 0, bm * gran_mn - mn))
    blocks = padded.view(*lead, bm, gran_mn, bk, gran_k)
    scale = fp8_scale_from_amax(blocks.abs().amax(dim=(-3, -1)), use_ue8m0)
    q = scale_blocks(blocks, scale[..., :, None, :, None], convention).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    q = q.view(*lead, bm * gran_mn, bk * gran_k)[..., :mn, :k]
    return q.to(FP8_DTYPE).contiguous(), scale.contiguous()


def expand_scales(scale: torch.Tensor, granularity: tuple[int, int], shape: tuple[int, ...]) -> torch.Tensor:
    """Per-element scales: block scales [..., bm, bk] repeated to the logical shape [..., MN, K]."""
    gm, gk = granularity
    mn, k = shape[-2], shape[-1]
    return scale.repeat_interleave(gm, dim=-2)[..., :mn, :].repeat_interleave(gk, dim=-1)[..., :k]


def dequantize_reference(qt: QuantTensor) -> torch.Tensor:
    """fp32 values of a logical QuantTensor."""
    if qt.element == "e2m1":
        from ...layouts.fp4 import e2m1_decode, unpack_e2m1
        values = e2m1_decode(unpack_e2m1(qt.data))
    else:
        values = qt.data.float()
    return values * expand_scales(qt.scale, qt.granularity, tuple(qt.shape))


def dequantized(operand: PreparedTensor) -> torch.Tensor:
    """fp32 values of an operand in the PLAIN format (what reference kernels read)."""
    return dequantize_reference(QuantTensor.unchecked(operand.data, operand.scale, operand.storage_granularity,
                                                      operand.ue8m0, operand.element))


@attrs.frozen
class CastInputs(Inputs):
    """One quantizer call (per_token_cast_to_fp8, per_block_cast_to_fp8, per_token_cast_to_fp4).

    x: bf16/fp16/fp32 [..., MN, K]; granularity: (gran_mn, gran_k); use_ue8m0: power-of-two scales
    out_format: the Format the scales are returned in — PLAIN (fp32 row-major) unless the caller
        asked for a consumer's bytes (prepare_for) and a provider emits them directly
    convention: one of CONVENTIONS ("portable" unless a drop-in module asks for its library's
        bytes); a provider that implements only "portable" declines the others in its check
    A provider returns (data, scale storage of out_format).
    """

    x: torch.Tensor
    granularity: tuple[int, int]
    use_ue8m0: bool
    out_format: Format = PLAIN
    convention: str = "portable"
    device_field = "x"

    def dims(self) -> dict[str, int]:
        return {"MN": self.x.shape[-2], "K": self.x.shape[-1]}


def nonfinite_ue8m0_error(op: str, arg: str = "x") -> ContractError:
    """The contract's error for NaN/Inf input when scales are rounded to powers of two (a block
    holding NaN/Inf has no UE8M0 scale)."""
    return ContractError(format_problem(
        op, arg, "a tensor with NaN or Inf values", "finite values when scales are rounded to powers of two",
        "clamp the input first (e.g. x.clamp(-1e4, 1e4)), or quantize with use_ue8m0=False (its NaN/Inf "
        "stay in their block)"))


@contextlib.contextmanager
def refusing_nonfinite_ue8m0(op: str, arg: str = "x") -> Iterator[None]:
    """Turn the layouts' refusal to round a NaN/Inf scale to UE8M0 into the contract's error.
    Quantizer providers use this, or raise `nonfinite_ue8m0_error` from their own pass;
    conformance holds every provider to it."""
    try:
        yield
    except LayoutConversionError as exc:
        raise nonfinite_ue8m0_error(op, arg) from exc


def _cast_op(granularity: tuple[int, int]) -> str:
    """The FP8 quantizer a granularity belongs to (for the reference kernel's messages)."""
    if granularity[0] == 1:
        return "per_token_cast_to_fp8"
    return "per_channel_cast_to_fp8" if granularity[1] == 1 else "per_block_cast_to_fp8"


def fp8_cast_kernel(call: CastInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference kernel of the FP8 quantizers: PLAIN output."""
    with refusing_nonfinite_ue8m0(_cast_op(call.granularity)):
        return quantize_blocks_reference(call.x, call.granularity[0], call.granularity[1], call.use_ue8m0,
                                         call.convention)


#: what the quantizers' reference kernels emit: the PLAIN format only
PLAIN_OUTPUT = {"out_format": (PLAIN,)}

PER_TOKEN_CAST = register_contract(OpContract(
    "per_token_cast_to_fp8", quantize_blocks_reference, Tolerance(dequantized=0.0, unquantized=1e-3),
    kernel=fp8_cast_kernel, kernel_formats=PLAIN_OUTPUT))
PER_BLOCK_CAST = register_contract(OpContract(
    "per_block_cast_to_fp8", quantize_blocks_reference, Tolerance(dequantized=0.0, unquantized=1e-3),
    kernel=fp8_cast_kernel, kernel_formats=PLAIN_OUTPUT))
PER_CHANNEL_CAST = register_contract(OpContract(
    "per_channel_cast_to_fp8", quantize_blocks_reference, Tolerance(dequantized=0.0, unquantized=1e-3),
    kernel=fp8_cast_kernel, kernel_formats=PLAIN_OUTPUT))


def check_float_input(op: str, x: Any, min_dim: int, max_dim: int) -> None:
    """x: a bf16/fp16/fp32 tensor with min_dim..max_dim dims."""
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_INPUT_DTYPES:
        raise ContractError(format_problem(op, "x", describe(x), f"a tensor of dtype {FLOAT_INPUT_DTYPES}",
                                           "pass bf16/fp16/fp32 values"))
    if not min_dim <= x.dim() <= max_dim:
        raise ContractError(format_problem(op, "x", f"{x.dim()}-D ({tuple(x.shape)})",
                                           f"{min_dim} to {max_dim} dims", "reshape to [..., rows, K]"))


def consumer(prepare_for: str | Callable[..., Any] | None, arg: str) -> OpContract | None:
    """The contract of the op that will consume a quantizer's result (checked before anything runs)."""
    if prepare_for is None:
        return None
    try:
        return _CONSUMERS[(prepare_for, arg)]
    except (KeyError, TypeError):  # TypeError: an unhashable prepare_for, refused below
        pass
    try:
        target = get_contract(prepare_for)
    except ContractError as exc:
        raise ContractError(f"argument 'prepare_for': {exc}") from None
    if not any(qa.name == arg for qa in target.quant_args):
        known = ", ".join(qa.name for qa in target.quant_args) or "none"
        raise ContractError(format_problem("prepare_for", "arg", repr(arg), f"a quantized argument of {target.name} "
                                           f"({known})", f"pass arg= one of {known}"))
    _CONSUMERS[(prepare_for, arg)] = target
    return target


#: (prepare_for, arg) -> the consumer's contract, once checked
_CONSUMERS: dict[tuple[Any, str], OpContract] = {}


def quantized_result(contract: OpContract, make: Callable[[Format], Inputs], shape: tuple[int, ...],
                     granularity: tuple[int, int], ue8m0: bool, element: str, target: OpContract | None,
                     arg: str) -> QuantTensor | PreparedTensor:
    """Run a quantizer. Without a consumer: a QuantTensor. With one (`prepare_for`): a PreparedTensor
    in the Format the selected backend stores the consumer's argument in — emitted directly when a
    provider writes that Format, else quantized to PLAIN and converted (never counted as implicit)."""
    inputs = make(PLAIN)
    plan = plan_for(contract, inputs)
    if target is None:
        data, scale = run_plan(plan, inputs)
        return QuantTensor.unchecked(data, scale, granularity, ue8m0, element)
    selection = plan.selection
    backend = selection.backend
    fmt = backend.format_for(target.name, target.quant_arg(arg), selection.options)
    params = backend_params(backend, dict(selection.options)) if backend.options else ()
    if fmt is PLAIN:  # the quantizer's own output is the consumer's bytes
        data, scale = run_plan(plan, inputs)
        return PreparedTensor.unchecked(data, scale, PLAIN, backend.name, shape, granularity, granularity, ue8m0,
                                        element, params)
    if ue8m0 or not fmt.requires_pow2:
        direct = make(fmt)
        direct_plan = plan_for(contract, direct)
        if direct_plan.accepts(direct):
            data, scale = run_plan(direct_plan, direct)
            return PreparedTensor.unchecked(data, scale, fmt, backend.name, shape, granularity,
                                            fmt.storage_granularity(granularity), ue8m0 or fmt.requires_pow2, element,
                                            params)
    data, scale = run_plan(plan, inputs)
    return to_backend(target, arg, QuantTensor(data, scale, granularity, ue8m0=ue8m0, element=element), selection,
                      implicit=False)


def check_convention(op: str, convention: Any) -> None:
    if convention not in CONVENTIONS:
        raise ContractError(format_problem(op, "convention", repr(convention), f"one of {CONVENTIONS}",
                                           "leave the default 'portable' (the drop-in modules pass their own)"))


def _cast(contract: OpContract, x: torch.Tensor, granularity: tuple[int, int], use_ue8m0: bool,
          prepare_for: str | Callable[..., Any] | None, arg: str, convention: str) -> QuantTensor | PreparedTensor:
    check_bool(contract.name, "use_ue8m0", use_ue8m0)
    check_convention(contract.name, convention)
    target = consumer(prepare_for, arg)
    return quantized_result(contract, lambda fmt: CastInputs(x, granularity, use_ue8m0, fmt, convention),
                            tuple(x.shape), granularity, use_ue8m0, "e4m3", target, arg)


@public_op(PER_TOKEN_CAST)
def per_token_cast_to_fp8(x: torch.Tensor, gran_k: int = 128, use_ue8m0: bool = False, *,
                          prepare_for: str | Callable[..., Any] | None = None,
                          arg: str = "a", convention: str = "portable") -> QuantTensor | PreparedTensor:
    """Quantize activations per token: x bf16/fp16/fp32 [..., M, K] ->
    QuantTensor(fp8 [..., M, K], fp32 [..., M, ceil(K/gran_k)]), granularity (1, gran_k).

    prepare_for: an op (name or function) whose argument `arg` will consume the result; the
    result is then a PreparedTensor already in the selected backend's bytes for that argument, so
    the op converts nothing. convention: "portable" (q = x / sf) or "deep_gemm" (q = x * (1/sf)).
    The result behaves like the pair (data, scale): q[0], q[1], len(q) == 2, unpacking.
    """
    if is_compiling():
        return compiled_call("per_token_cast_to_fp8", x, gran_k, use_ue8m0, prepare_for=prepare_for, arg=arg,
                             convention=convention)
    check_float_input(PER_TOKEN_CAST.name, x, 2, 3)
    check_int(PER_TOKEN_CAST.name, "gran_k", gran_k, 1, fix="pass e.g. 128")
    return _cast(PER_TOKEN_CAST, x, (1, gran_k), use_ue8m0, prepare_for, arg, convention)


@public_op(PER_BLOCK_CAST)
def per_block_cast_to_fp8(x: torch.Tensor, block: tuple[int, int] = (128, 128), use_ue8m0: bool = False, *,
                          prepare_for: str | Callable[..., Any] | None = None,
                          arg: str = "b", convention: str = "portable") -> QuantTensor | PreparedTensor:
    """Quantize weights per block: x bf16/fp16/fp32 [(G,) N, K] -> QuantTensor(fp8 [(G,) N, K],
    fp32 [(G,) ceil(N/block[0]), ceil(K/block[1])]), granularity `block`. `prepare_for` as in
    per_token_cast_to_fp8 (default argument "b"); convention as in per_token_cast_to_fp8."""
    if is_compiling():
        return compiled_call("per_block_cast_to_fp8", x, block, use_ue8m0, prepare_for=prepare_for, arg=arg,
                             convention=convention)
    check_float_input(PER_BLOCK_CAST.name, x, 2, 3)
    if not (isinstance(block, (tuple, list)) and len(block) == 2):
        raise ContractError(format_problem(PER_BLOCK_CAST.name, "block", repr(block), "a pair (gran_n, gran_k)",
                                           "pass e.g. (128, 128)"))
    check_int(PER_BLOCK_CAST.name, "block[0]", block[0], 1, fix="pass e.g. (128, 128)")
    check_int(PER_BLOCK_CAST.name, "block[1]", block[1], 1, fix="pass e.g. (128, 128)")
    return _cast(PER_BLOCK_CAST, x, (int(block[0]), int(block[1])), use_ue8m0, prepare_for, arg, convention)


@public_op(PER_CHANNEL_CAST)
def per_channel_cast_to_fp8(x: torch.Tensor, gran_k: int = 128, use_ue8m0: bool = False, *,
                            convention: str = "portable") -> QuantTensor:
    """Quantize per channel: one scale per (gran_k rows, 1 column) — x bf16/fp16/fp32 [(G,) K, N] ->
    QuantTensor(fp8 [(G,) K, N], fp32 [(G,) ceil(K/gran_k), N]), granularity (gran_k, 1).

    The K-grouped GEMMs' operand quantizer (DeepGEMM's and TileKernels' per_channel_cast): x is
    stored K x N (N contiguous) and every column gets one scale per gran_k rows. K need not be a
    multiple of gran_k (the last block is partial). convention as in per_token_cast_to_fp8.
    """
    if is_compiling():
        return compiled_call("per_channel_cast_to_fp8", x, gran_k, use_ue8m0, convention=convention)
    check_float_input(PER_CHANNEL_CAST.name, x, 2, 3)
    check_int(PER_CHANNEL_CAST.name, "gran_k", gran_k, 1, fix="pass e.g. 128")
    return _cast(PER_CHANNEL_CAST, x, (gran_k, 1), use_ue8m0, None, "a", convention)


def dequantize(q: QuantTensor | PreparedTensor | tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """fp32 values of a quantized tensor in any form: QuantTensor, a raw (data, scale) tuple, or a
    PreparedTensor in any Format (decoded by its Format)."""
    if isinstance(q, PreparedTensor):
        q = as_quant(q)
    elif not isinstance(q, QuantTensor):
        q = quant_operand(_DEQUANT_VIEW, "q", q)
    return dequantize_reference(q)


# The argument description dequantize uses to read raw tuples (any granularity is inferred).
_DEQUANT_VIEW = OpContract("dequantize", dequantize_reference, Tolerance(0.0), (QuantArg("q", "lhs", (1, 128)),))
