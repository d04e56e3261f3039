"""Native TileKernels recasts of the cpu backend beyond casts.py (C++ in kernels/quant_extra.cpp):
per_block_cast_lossless, the exact E2M1 -> E4M3 recast — one pass over the scales (validated
there), one over the codes, by table; bytes equal the reference's."""

from __future__ import annotations

from pathlib import Path

import torch

from portable_kernels.core.native.build import I32, I64, PTR, NativeLibrary, num_threads, register_library
from portable_kernels.core.tensors import FP8_DTYPE, cdiv

from .._names import BACKEND, NATIVE
from . import _checks as chk

LIB = register_library(NativeLibrary("cpu_quant_extra", Path(__file__).parent.parent / "kernels" / "quant_extra.cpp", {
    "pk_lossless_cast": [PTR, PTR, I64, I64, I64, I64, I64, I64, PTR, PTR, I32],
}, returns={"pk_lossless_cast": I64}, owner=BACKEND))

OP = "per_block_cast_lossless"


def lossless_cast(data: torch.Tensor, sf: torch.Tensor, in_block: tuple[int, int], out_block: tuple[int, int]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """packed E2M1 uint8/int8 [M, K/2] + fp32 sf [ceil(M/ibm), ceil(K/ibk)] -> (e4m3 [M, K], fp32
    [ceil(M/obm), ceil(K/obk)]); scale values refused with the reference's ContractError."""
    lib = LIB.get()
    if lib is None:
        raise RuntimeError(f"{OP}: native recast unavailable: {LIB.reason()}")
    (ibm, ibk), (obm, obk) = in_block, out_block
    if min(ibm, ibk, obm, obk) < 1 or obm % ibm or obk % ibk:
        chk.fail(OP, "out_block_size", repr(out_block), f"a multiple of {in_block}", "pass e.g. (128, 128)")
    chk.tensor(OP, "data", data, (torch.uint8, torch.int8), None, "pass packed E2M1 codes [M, K/2]")
    if data.dim() != 2:
        chk.fail(OP, "data", f"{data.dim()}-D", "2-D [M, K/2]", "pass packed E2M1 codes [M, K/2]")
    m, k = data.shape[0], data.shape[1] * 2
    chk.tensor(OP, "sf", sf, (torch.float32,), (cdiv(m, ibm), cdiv(k, ibk)), "pass the scales of the data")
    data, sf = data.contiguous(), sf.contiguous()
    out = torch.empty(m, k, dtype=torch.uint8)
    out_sf = torch.empty(cdiv(m, obm), cdiv(k, obk), dtype=torch.float32)
    if m and k:
        code = lib.pk_lossless_cast(data.data_ptr(), sf.data_ptr(), m, k, ibm, ibk, obm, obk, out.data_ptr(),
                                    out_sf.data_ptr(), num_threads())
        if code:
            from portable_kernels.ops.quant.lossless import lossless_plan
            lossless_plan(sf, in_block, out_block, m, k)  # raises the contract's error naming sf
            raise RuntimeError(f"{OP}: the native recast refused scales the reference accepts (code {code})")
    return out.view(FP8_DTYPE), out_sf


def _available(call) -> list[str]:
    return [] if LIB.get() is not None else [f"native recast unavailable: {LIB.reason()}"]


def register(registry) -> None:
    from portable_kernels.ops.quant.lossless import PER_BLOCK_CAST_LOSSLESS
    registry.kernel(PER_BLOCK_CAST_LOSSLESS.name, BACKEND, NATIVE, priority=10,
                    dtypes={"data": (torch.uint8, torch.int8)}, devices=("cpu",), check=_available,
                    doc="C++ (deepjit): scales checked and block exponents in one pass, codes by table in another")(
        lambda call: lossless_cast(call.data, call.sf, call.in_block, call.out_block))
