"""`per_token_cast_to_e5m6`: TileKernels' cast of a matrix to E5M6 (12-bit floats, eight packed in
12 bytes; `portable_kernels.layouts.e5m6`) with one fp32 scale per (1, num_per_channels) block.

Contract (TileKernels' `per_token_cast(x, 'e5m6', ...)`): per block, amax = max|x| clamped to
>= 1e-4; sf = amax / 65024 and the data is the E5M6 code of x · (65024 / amax) — a multiply by the
fp32 quotient, not a division by sf; with round_sf, sf is rounded up to a power of two
(ceil_to_ue8m0) and the data is x · (1 / sf) (exact). The codes follow `e5m6_encode` bit for bit.
K must be a multiple of 8 (the packing); a partial trailing block is allowed. NaN/Inf input: with
round_sf it is refused (a power-of-two scale cannot carry it); without, it propagates as the
formulas say (a NaN makes its block's scale and codes NaN; an Inf makes the scale inf and the
block's values 0, its own code NaN), every NaN product encoded as the quiet NaN 0x7FC00000, code
0x7FF (TileKernels' bytes for NaN follow the device's NaN: CUDA's 0x7FFFFFFF rounds to 0x800, -0).
Decoding: `e5m6_cast_back`.
The rule kept: codes, packing and power-of-two rounding come from `portable_kernels.layouts`.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from ...core.checks import check_bool, check_int
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.providers import Inputs
from ...core.tensors import cdiv, describe
from ...layouts.constants import SCALE_AMAX_FLOOR
from ...layouts.e5m6 import E5M6_GROUP, E5M6_MAX, e5m6_decode, e5m6_encode, pack_e5m6, unpack_e5m6
from ...layouts.errors import LayoutConversionError
from .block_cast import scale_and_inverse
from .fp8 import FLOAT_INPUT_DTYPES

#: the output dtypes of e5m6_cast_back
BACK_DTYPES = (torch.bfloat16, torch.float32)


def e5m6_cast_reference(x: torch.Tensor, num_per_channels: int, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference math: x [M, K] (K % 8 == 0) -> (uint8 [M, K * 3 / 2] packed E5M6, fp32 [M, ceil(K / n)])."""
    m, k = x.shape
    n = num_per_channels
    g = cdiv(k, n)
    blocks = F.pad(x.float(), (0, g * n - k)).view(m, g, n)
    amax = blocks.abs().amax(dim=-1).clamp_min(SCALE_AMAX_FLOOR)
    sf, inv = scale_and_inverse(amax, E5M6_MAX, round_sf)
    q = (blocks * inv[..., None]).view(m, g * n)[:, :k]
    q = torch.where(torch.isnan(q), torch.full_like(q, float("nan")), q)  # one NaN: +0x7FC00000 (code 0x7FF)
    return pack_e5m6(e5m6_encode(q)).contiguous(), sf.contiguous()


@attrs.frozen
class E5M6CastInputs(Inputs):
    """One per_token_cast_to_e5m6 call (validated): x bf16/fp16/fp32 [M, K], K % 8 == 0;
    num_per_channels >= 1; round_sf. A provider returns what `e5m6_cast_reference` returns."""

    x: torch.Tensor
    num_per_channels: int
    round_sf: bool
    device_field = "x"

    def dims(self) -> dict[str, int]:
        return {"M": self.x.shape[0], "K": self.x.shape[1], "n": self.num_per_channels}


def nonfinite_error(op: str = "per_token_cast_to_e5m6") -> ContractError:
    """The contract's error for NaN/Inf input with round_sf."""
    return ContractError(format_problem(op, "x", "a tensor with NaN or Inf values (round_sf=True)", "finite values",
                                        "a power-of-two scale cannot carry NaN/Inf; clean the input, or cast with "
                                        "round_sf=False (NaN/Inf then propagate)"))


def e5m6_cast_kernel(call: E5M6CastInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference kernel of per_token_cast_to_e5m6 (ceil_to_ue8m0's refusal becomes the contract's error)."""
    try:
        return e5m6_cast_reference(call.x, call.num_per_channels, call.round_sf)
    except LayoutConversionError as exc:
        raise nonfinite_error() from exc


PER_TOKEN_CAST_E5M6 = register_contract(OpContract(
    "per_token_cast_to_e5m6", e5m6_cast_reference, Tolerance(dequantized=0.0, unquantized=1e-4),
    kernel=e5m6_cast_kernel))


def check_e5m6_input(op: str, x: object) -> torch.Tensor:
    """x must be a bf16/fp16/fp32 [M, K] tensor with K a multiple of 8."""
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_INPUT_DTYPES or x.dim() != 2:
        raise ContractError(format_problem(op, "x", describe(x), f"a 2-D tensor [M, K] of dtype {FLOAT_INPUT_DTYPES}",
                                           "pass bf16/fp32 values [tokens, hidden]"))
    if x.shape[1] % E5M6_GROUP:
        raise ContractError(format_problem(op, "x", f"of shape {tuple(x.shape)} (K = {x.shape[1]})",
                                           "K a multiple of 8 (eight E5M6 codes per 12 bytes)", "pad K to a multiple "
                                           "of 8"))
    return x


@public_op(PER_TOKEN_CAST_E5M6)
def per_token_cast_to_e5m6(x: torch.Tensor, num_per_channels: int, round_sf: bool = False
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast x to E5M6 with one scale per (1, num_per_channels) block by TileKernels' rule (module docstring).

    x: bf16/fp16/fp32 [M, K], K % 8 == 0; num_per_channels: the block width (TileKernels passes K);
    round_sf: power-of-two scales. Returns (uint8 [M, K * 3 / 2] packed E5M6, fp32 [M, ceil(K / n)]).
    """
    if is_compiling():
        return compiled_call("per_token_cast_to_e5m6", x, num_per_channels, round_sf)
    op = PER_TOKEN_CAST_E5M6.name
    check_e5m6_input(op, x)
    check_int(op, "num_per_channels", num_per_channels, 1, fix="pass e.g. the hidden size")
    check_bool(op, "round_sf", round_sf)
    return run(PER_TOKEN_CAST_E5M6, E5M6CastInputs(x, int(num_per_channels), round_sf))


def e5m6_cast_back(data: torch.Tensor, sf: torch.Tensor, block: tuple[int, int],
                   out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Values of packed E5M6 data with fp32 block scales: (code value · sf) in fp32, then out_dtype.

    data: uint8 [M, K * 3 / 2]; sf: fp32 [ceil(M / bm), ceil(K / bk)] (logical, any strides);
    block: (bm, bk); out_dtype: bf16 or fp32 (rounded to nearest even from the fp32 product).
    """
    op = "e5m6_cast_back"
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] % 12:
        raise ContractError(format_problem(op, "data", describe(data), "uint8 [M, K * 3 / 2] packed E5M6 (a "
                                           "multiple of 12 bytes per row)", "pass the data per_token_cast_to_e5m6 "
                                           "returned"))
    if not (isinstance(block, (tuple, list)) and len(block) == 2):
        raise ContractError(format_problem(op, "block", repr(block), "a pair (bm, bk)", "pass e.g. (1, hidden)"))
    for i, edge in enumerate(block):
        check_int(op, f"block[{i}]", edge, 1, fix="pass the block the data was cast with")
    if out_dtype not in BACK_DTYPES:
        raise ContractError(format_problem(op, "out_dtype", repr(out_dtype), f"one of {BACK_DTYPES}",
                                           "pass torch.bfloat16 or torch.float32"))
    m, k = data.shape[0], data.shape[1] // 12 * E5M6_GROUP
    bm, bk = int(block[0]), int(block[1])
    want = (cdiv(m, bm), cdiv(k, bk))
    if not isinstance(sf, torch.Tensor) or sf.dtype != torch.float32 or tuple(sf.shape) != want \
            or sf.device != data.device:
        raise ContractError(format_problem(op, "sf", describe(sf), f"fp32 scales {list(want)} on {data.device}",
                                           "pass the scales returned with the data"))
    values = e5m6_decode(unpack_e5m6(data))
    scale = sf.repeat_interleave(bm, dim=0)[:m].repeat_interleave(bk, dim=1)[:, :k]
    return (values * scale).to(out_dtype)
