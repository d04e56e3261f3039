"""`per_block_cast_lossless`: TileKernels' exact recast of FP4 (E2M1, power-of-two block scales) to
FP8 (E4M3) with larger scale blocks.

Contract (TileKernels' `quant.per_block_cast_lossless`): x is packed E2M1 data [M, K/2] (two codes
per byte, low nibble first) with fp32 scales per (ibm, ibk) input block, every scale a positive
power of two 2^(e - 127) (e its biased exponent); the output block (obm, obk) is a multiple of the
input block. Per output block, E = max(e over the input blocks it covers) - 6: the output scale is
2^(E - 127) (the largest input scale / 2^6), and each value becomes the E4M3 value of
code · 2^(e - E) — exact, since |code| <= 6 and e - E is in [-5, 6], so dequantizing the output
gives the input's values bit for bit. Refused (ContractError naming sf; x in the drop-in): a scale that is not a
positive finite power of two (TileKernels reads only its exponent bits), an output block whose
scales span more than 2^11 (e < E - 5: TileKernels' device assert), and an output block whose
largest scale is below 2^-120 (its output scale would underflow to 0; TileKernels stores 0).
The scale storages (col-major, packed UE8M0) are the tile_kernels drop-in's business; this op
takes and returns logical fp32 scales.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from ...core.checks import check_int
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.providers import Inputs
from ...core.tensors import FP8_DTYPE, cdiv, describe
from ...layouts.fp4 import e2m1_decode, unpack_e2m1

#: the output scale is the largest input scale / 2^SCALE_SHIFT
SCALE_SHIFT = 6
#: an input scale may be at most 2^MAX_SPAN below its output block's largest
MAX_SPAN = 11
#: the largest input scale of an output block must have biased exponent >= MIN_TOP_EXPONENT
MIN_TOP_EXPONENT = SCALE_SHIFT + 1
#: the packed E2M1 dtypes (TileKernels' int8; uint8 as the layouts write them)
FP4_DATA_DTYPES = (torch.int8, torch.uint8)
OP = "per_block_cast_lossless"


def _problem(given: str, expected: str, fix: str) -> ContractError:
    return ContractError(format_problem(OP, "sf", given, expected, fix))


def scale_exponents(sf: torch.Tensor) -> torch.Tensor:
    """int32 biased exponents of positive power-of-two fp32 scales (ContractError naming x otherwise)."""
    bits = sf.contiguous().view(torch.int32)
    bad = (bits <= 0) | ((bits & 0x7FFFFF) != 0) | ((bits >> 23) >= 255)
    if bool(bad.any()):
        at = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise _problem(f"with scale {float(sf[at])!r} at block {at}", "positive finite power-of-two (UE8M0) scales",
                       "cast the FP4 input with round_sf=True")
    return bits >> 23


def lossless_plan(sf: torch.Tensor, in_block: tuple[int, int], out_block: tuple[int, int], m: int, k: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(shift int32 [ceil(M/ibm), ceil(K/ibk)] = e - E per input block, E int32 [ceil(M/obm), ceil(K/obk)])."""
    e = scale_exponents(sf)
    rm, rk = out_block[0] // in_block[0], out_block[1] // in_block[1]
    gm, gk = cdiv(m, out_block[0]), cdiv(k, out_block[1])
    padded = F.pad(e, (0, gk * rk - e.shape[1], 0, gm * rm - e.shape[0]))  # exponent 0: below every real scale
    top = padded.view(gm, rm, gk, rk).amax(dim=(1, 3))
    if bool((top < MIN_TOP_EXPONENT).any()):
        at = tuple(int(i) for i in torch.nonzero(top < MIN_TOP_EXPONENT)[0])
        raise _problem(f"with an output block {at} whose largest scale is 2^{int(top[at]) - 127}",
                       f"a largest scale >= 2^{MIN_TOP_EXPONENT - 127} per output block (the FP8 scale, that "
                       f"/ 2^{SCALE_SHIFT}, must stay normal)", "rescale the input")
    big = top - SCALE_SHIFT
    shift = e - big.repeat_interleave(rm, 0)[: e.shape[0]].repeat_interleave(rk, 1)[:, : e.shape[1]]
    if bool((shift < SCALE_SHIFT - MAX_SPAN).any()):
        at = tuple(int(i) for i in torch.nonzero(shift < SCALE_SHIFT - MAX_SPAN)[0])
        raise _problem(f"with scale 2^{int(e[at]) - 127} at block {at}, more than 2^{MAX_SPAN} below its output "
                       "block's largest", f"scales within 2^{MAX_SPAN} of each other per output block (else E4M3 "
                       "cannot hold the smallest values exactly)", "use smaller output blocks")
    return shift, big


def lossless_cast_reference(data: torch.Tensor, sf: torch.Tensor, in_block: tuple[int, int],
                            out_block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference math: packed E2M1 [M, K/2] + fp32 sf [ceil(M/ibm), ceil(K/ibk)] ->
    (fp8 e4m3 [M, K], fp32 [ceil(M/obm), ceil(K/obk)])."""
    m, k = data.shape[0], data.shape[1] * 2
    shift, big = lossless_plan(sf, in_block, out_block, m, k)
    values = e2m1_decode(unpack_e2m1(data))
    factor = ((shift + 127) << 23).view(torch.float32)  # 2^(e - E), exact
    factor = factor.repeat_interleave(in_block[0], 0)[:m].repeat_interleave(in_block[1], 1)[:, :k]
    out = (values * factor).to(FP8_DTYPE)  # exact: every product is an E4M3 value
    return out.contiguous(), (big << 23).view(torch.float32).contiguous()


@attrs.frozen
class LosslessCastInputs(Inputs):
    """One per_block_cast_lossless call (validated shapes and dtypes; scale values are checked by the
    provider, ContractError naming sf): data int8/uint8 [M, K/2], sf fp32 [ceil(M/ibm), ceil(K/ibk)] contiguous, in_block,
    out_block (a multiple of in_block). A provider returns what `lossless_cast_reference` returns."""

    data: torch.Tensor
    sf: torch.Tensor
    in_block: tuple[int, int]
    out_block: tuple[int, int]
    device_field = "data"

    def dims(self) -> dict[str, int]:
        return {"M": self.data.shape[0], "K": self.data.shape[1] * 2}


def lossless_cast_kernel(call: LosslessCastInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return lossless_cast_reference(call.data, call.sf, call.in_block, call.out_block)


PER_BLOCK_CAST_LOSSLESS = register_contract(OpContract(
    OP, lossless_cast_reference, Tolerance(dequantized=0.0, unquantized=0.0), kernel=lossless_cast_kernel))


def _check_block(arg: str, block: object) -> tuple[int, int]:
    if not (isinstance(block, (tuple, list)) and len(block) == 2):
        raise ContractError(format_problem(OP, arg, repr(block), "a pair (rows, columns)", "pass e.g. (1, 32)"))
    for i, edge in enumerate(block):
        check_int(OP, f"{arg}[{i}]", edge, 1, fix="pass positive block edges")
    return int(block[0]), int(block[1])


@public_op(PER_BLOCK_CAST_LOSSLESS)
def per_block_cast_lossless(data: torch.Tensor, sf: torch.Tensor, x_block_size: tuple[int, int],
                            out_block_size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Recast packed E2M1 data with power-of-two scales to E4M3 exactly (module docstring).

    data: int8/uint8 [M, K/2] packed E2M1 (low nibble first); sf: fp32 [ceil(M/ibm), ceil(K/ibk)]
    (any strides), positive powers of two; x_block_size: (ibm, ibk) of sf; out_block_size:
    (obm, obk), multiples of (ibm, ibk). Returns (fp8 e4m3 [M, K], fp32 [ceil(M/obm), ceil(K/obk)]),
    the output scale of a block the largest input scale it covers / 2^6.
    """
    if is_compiling():
        return compiled_call("per_block_cast_lossless", data, sf, x_block_size, out_block_size)
    if not isinstance(data, torch.Tensor) or data.dtype not in FP4_DATA_DTYPES or data.dim() != 2:
        raise ContractError(format_problem(OP, "data", describe(data), "packed E2M1 codes int8/uint8 [M, K/2]",
                                           "pass the data of an e2m1 cast (two codes per byte)"))
    ib, ob = _check_block("x_block_size", x_block_size), _check_block("out_block_size", out_block_size)
    if ob[0] % ib[0] or ob[1] % ib[1]:
        raise ContractError(format_problem(OP, "out_block_size", repr(tuple(out_block_size)),
                                           f"a multiple of x_block_size {ib}", "pass e.g. (128, 128) or (1, 128)"))
    m, k = data.shape[0], data.shape[1] * 2
    want = (cdiv(m, ib[0]), cdiv(k, ib[1]))
    if not isinstance(sf, torch.Tensor) or sf.dtype != torch.float32 or tuple(sf.shape) != want \
            or sf.device != data.device:
        raise ContractError(format_problem(OP, "sf", describe(sf), f"fp32 scales {list(want)} on {data.device}",
                                           "pass the scales returned with the data"))
    return run(PER_BLOCK_CAST_LOSSLESS, LosslessCastInputs(data.contiguous(), sf.contiguous(), ib, ob))
