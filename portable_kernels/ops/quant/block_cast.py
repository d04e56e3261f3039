"""`block_cast`: TileKernels' cast of a matrix to FP8 (e4m3) or FP4 (e2m1) with one scale per
(bm x bk) block — per token (1, n), per block (m, n) or per channel (m, 1).

Contract (TileKernels' scale rule, which differs from `per_token_cast_to_fp8` at rounding ties):
per block, amax = max|x| clamped to >= clamp_min (default 1e-4 for e4m3, 6·2^-126 for e2m1);
sf = amax / max (max = 448 or 6) and the data is q = x · (max / amax) — a multiply by the
quotient computed in fp32, not a division by sf; with round_sf, sf is rounded up to a power of
two and q = x · (1 / sf) (exact). e4m3: q clamped to ±448, cast round-to-nearest-even. e2m1:
round to nearest, ties to even, sign kept (tiny negatives give -0), |q| > 6 saturates; two codes
per byte, even element low. With precomputed scales `sf`, q = x · (1 / sf) (cast only).
Partial trailing blocks are allowed. NaN/Inf input is refused for e2m1 (E2M1 has no such code)
and with round_sf (a power-of-two scale cannot carry it); e4m3 without round_sf lets it propagate.
The rule kept: codes, packing and power-of-two rounding come from `portable_kernels.layouts`.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from ...core.checks import check_bool, check_int, check_tensor
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...layouts.constants import FP4_E2M1_MAX, FP8_E4M3_MAX, SCALE_AMAX_FLOOR
from ...layouts.errors import LayoutConversionError
from ...layouts.fp4 import e2m1_encode, pack_e2m1
from ...layouts.ue8m0 import ceil_to_ue8m0
from ...core.providers import Inputs
from .fp8 import FLOAT_INPUT_DTYPES
from ...core.tensors import FP8_DTYPE, QuantTensor, cdiv, describe

#: element formats of the cast and the largest magnitude each holds
ELEMENT_MAX = {"e4m3": FP8_E4M3_MAX, "e2m1": FP4_E2M1_MAX}
#: TileKernels' default amax floors: 1e-4 for FP8; for FP4 the one that makes an all-zero block's
#: scale the smallest normal fp32, 2^-126
DEFAULT_CLAMP_MIN = {"e4m3": SCALE_AMAX_FLOOR, "e2m1": FP4_E2M1_MAX * 2.0 ** -126}


def _divide(numerator: torch.Tensor | float, denominator: torch.Tensor | float) -> torch.Tensor:
    """Element-wise IEEE division in fp32 (one operand may be a Python number). Dividing by a Python
    scalar on a GPU becomes a multiply by its reciprocal, which can change the last bit; dividing
    tensor by tensor stays a division on every device."""
    like = numerator if isinstance(numerator, torch.Tensor) else denominator
    if not isinstance(numerator, torch.Tensor):
        numerator = torch.full_like(like, numerator)
    if not isinstance(denominator, torch.Tensor):
        denominator = torch.full_like(like, denominator)
    return numerator / denominator


def scale_and_inverse(amax: torch.Tensor, top: float, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf, 1/sf as the casts multiply by it) from each block's amax and the element's largest value:
    sf = amax / top rounded up to a power of two with round_sf (inverse 1 / sf), else sf = amax / top
    with inverse top / amax (one rounding, as the upstream kernels compute it)."""
    if round_sf:
        sf = ceil_to_ue8m0(_divide(amax, top))
        return sf, _divide(1.0, sf)
    return _divide(amax, top), _divide(top, amax)


def block_cast_reference(x: torch.Tensor, block: tuple[int, int], element: str, round_sf: bool,
                         clamp_min: float, sf: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference math: x [M, K] -> (data, fp32 sf [ceil(M/bm), ceil(K/bk)]).

    data: fp8 e4m3 [M, K], or uint8 [M, K/2] packed E2M1 codes. With `sf` given the scales are
    taken as they are (and returned).
    """
    gm, gk = block
    m, k = x.shape
    bm, bk = cdiv(m, gm), cdiv(k, gk)
    blocks = F.pad(x.float(), (0, bk * gk - k, 0, bm * gm - m)).view(bm, gm, bk, gk)
    top = ELEMENT_MAX[element]
    if sf is None:
        amax = blocks.abs().amax(dim=(1, 3)).clamp_min(clamp_min)
        sf, inv = scale_and_inverse(amax, top, round_sf)
    else:
        sf = sf.float()
        inv = _divide(1.0, sf)
    q = (blocks * inv[:, None, :, None]).view(bm * gm, bk * gk)[:m, :k]
    if element == "e4m3":
        data = q.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)
    else:
        data = pack_e2m1(e2m1_encode(q))
    return data.contiguous(), sf.contiguous()


@attrs.frozen
class BlockCastInputs(Inputs):
    """One block_cast call (validated): x bf16/fp16/fp32 [M, K]; block (bm, bk); element "e4m3" or
    "e2m1"; round_sf; clamp_min (the amax floor); sf None or fp32 [ceil(M/bm), ceil(K/bk)] given
    scales (cast only). A provider returns (data, fp32 sf) as `block_cast_reference` does."""

    x: torch.Tensor
    block: tuple[int, int]
    element: str
    round_sf: bool
    clamp_min: float
    sf: torch.Tensor | None
    device_field = "x"

    def dims(self) -> dict[str, int]:
        return {"M": self.x.shape[0], "K": self.x.shape[1], "bm": self.block[0], "bk": self.block[1]}


def nonfinite_error() -> ContractError:
    """The contract's error for NaN/Inf input where E2M1 codes or power-of-two scales cannot carry it."""
    return ContractError(format_problem("block_cast", "x", "a tensor with NaN or Inf values", "finite values",
                                        "E2M1 codes and power-of-two scales cannot carry NaN/Inf; clean the input "
                                        "before casting"))


def block_cast_kernel(call: BlockCastInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference kernel of block_cast (the layouts refuse NaN/Inf codes and scales; that refusal
    becomes the contract's error)."""
    try:
        return block_cast_reference(call.x, call.block, call.element, call.round_sf, call.clamp_min, call.sf)
    except LayoutConversionError as exc:
        raise nonfinite_error() from exc


BLOCK_CAST = register_contract(OpContract(
    "block_cast", block_cast_reference, Tolerance(dequantized=0.0, unquantized=2e-2), kernel=block_cast_kernel))


def _check_args(op: str, x: object, fmt: object, block_size: object, round_sf: object, clamp_min: object,
                sf: object) -> tuple[int, int]:
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_INPUT_DTYPES or x.dim() != 2:
        raise ContractError(format_problem(op, "x", describe(x), f"a 2-D tensor [M, K] of dtype {FLOAT_INPUT_DTYPES}",
                                           "pass bf16/fp32 values; dequantize quantized inputs first (cast_back)"))
    if fmt not in ELEMENT_MAX:
        raise ContractError(format_problem(op, "fmt", repr(fmt), f"one of {tuple(ELEMENT_MAX)}",
                                           "pass 'e4m3' (FP8) or 'e2m1' (FP4)"))
    if not (isinstance(block_size, (tuple, list)) and len(block_size) == 2):
        raise ContractError(format_problem(op, "block_size", repr(block_size), "a pair (bm, bk)",
                                           "pass e.g. (1, 128) per token, (128, 128) per block, (128, 1) per channel"))
    for i, edge in enumerate(block_size):
        check_int(op, f"block_size[{i}]", edge, 1, fix="pass positive block edges, e.g. (1, 128)")
    check_bool(op, "round_sf", round_sf)
    if fmt == "e2m1" and x.shape[1] % 2:
        raise ContractError(format_problem(op, "x", f"of shape {tuple(x.shape)} (odd K)",
                                           "an even K for e2m1 (two codes per byte)", "pad K to an even length"))
    if clamp_min is not None and (isinstance(clamp_min, bool) or not isinstance(clamp_min, (int, float))
                                  or not clamp_min > 0 or clamp_min == float("inf")):
        raise ContractError(format_problem(op, "clamp_min", repr(clamp_min), "None or a finite number > 0",
                                           "pass e.g. 1e-4, or None for the format's default"))
    bm, bk = cdiv(x.shape[0], block_size[0]), cdiv(x.shape[1], block_size[1])
    if sf is not None:
        check_tensor(op, "sf", sf, (torch.float32,), (bm, bk), x.device,
                     f"pass fp32 scales [ceil(M/bm), ceil(K/bk)] = [{bm}, {bk}]")
        if checks_values(sf) and sf.numel() and not bool(((sf > 0) & torch.isfinite(sf)).all()):
            raise ContractError(format_problem(op, "sf", "with a zero, negative or non-finite scale",
                                               "positive finite scales", "pass the scales of a previous cast"))
    return int(block_size[0]), int(block_size[1])


@public_op(BLOCK_CAST)
def block_cast(x: torch.Tensor, fmt: str, block_size: tuple[int, int], round_sf: bool = False, *,
               clamp_min: float | None = None, sf: torch.Tensor | None = None) -> QuantTensor:
    """Cast x to FP8/FP4 with one scale per block by TileKernels' rule (see the module docstring).

    x: bf16/fp16/fp32 [M, K]; fmt: "e4m3" or "e2m1"; block_size: (bm, bk), e.g. (1, 128) per token,
    (128, 128) per block, (128, 1) per channel; round_sf: power-of-two scales;
    clamp_min: the amax floor (None: 1e-4 for e4m3, 6·2^-126 for e2m1); sf: None, or fp32 scales
    [ceil(M/bm), ceil(K/bk)] to cast with (no amax pass).
    Returns QuantTensor(fp8 [M, K] or uint8 [M, K/2] packed e2m1, fp32 [ceil(M/bm), ceil(K/bk)]),
    granularity block_size.
    """
    if is_compiling():
        return compiled_call("block_cast", x, fmt, block_size, round_sf, clamp_min=clamp_min, sf=sf)
    op = BLOCK_CAST.name
    block = _check_args(op, x, fmt, block_size, round_sf, clamp_min, sf)
    if fmt == "e2m1" and checks_values(x) and x.numel() and not bool(torch.isfinite(x).all()):
        raise nonfinite_error()  # also found by every provider; checked here before any work (as the FP4 cast)
    floor = float(DEFAULT_CLAMP_MIN[fmt] if clamp_min is None else clamp_min)
    data, scale = run(BLOCK_CAST, BlockCastInputs(x, block, fmt, round_sf, floor, sf))
    return QuantTensor.unchecked(data, scale, block, round_sf and sf is None, fmt)
