"""FP4 (E2M1) quantization: `per_token_cast_to_fp4(x, gran_k=32, use_ue8m0=True)`.

Per (1, gran_k) block, amax clamped to >= 1e-4, sf = amax / 6 (rounded up to a power of two when
use_ue8m0), codes = E2M1 of x / sf (round to nearest, ties to even, |x / sf| > 6 saturates) packed
two per byte, even element low. The FP8xFP4 GEMM is in ops/gemm/fp4.py.
The rule kept: every byte format comes from portable_kernels.layouts (E2M1 codes, packing, scales).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from ...core.checks import check_bool, check_int
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ...core.errors import ContractError, format_problem
from ...layouts.constants import FP4_E2M1_MAX, MX_BLOCK_K, SCALE_AMAX_FLOOR
from ...layouts.fp4 import e2m1_encode, e2m1_encode_ties_toward_zero, fp4_scale_from_amax, pack_e2m1
from .fp8 import (PLAIN_OUTPUT, CastInputs, check_convention, check_float_input, consumer, quantized_result,
                  refusing_nonfinite_ue8m0, scale_blocks)
from ...core.tensors import PreparedTensor, QuantTensor, cdiv


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


def fp4_cast_kernel(call: CastInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference kernel of per_token_cast_to_fp4: PLAIN output."""
    with refusing_nonfinite_ue8m0("per_token_cast_to_fp4"):
        return quantize_fp4_reference(call.x, call.granularity[1], call.use_ue8m0, call.convention)


PER_TOKEN_CAST_FP4 = register_contract(OpContract(
    "per_token_cast_to_fp4", quantize_fp4_reference, Tolerance(dequantized=0.0, unquantized=2e-2),
    kernel=fp4_cast_kernel, kernel_formats=PLAIN_OUTPUT))


def _check_finite_values(op: str, x: torch.Tensor) -> None:
    # Only where reading the data costs no device sync (contract.checks_values); NaN/Inf have no E2M1 code.
    if checks_values(x) and x.numel() and not bool(torch.isfinite(x).all()):
        raise ContractError(format_problem(op, "x", "a tensor with NaN or Inf values", "finite values",
                                           "E2M1 has no NaN/Inf code; clean the input before quantizing"))


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
