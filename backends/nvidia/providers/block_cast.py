"""nvidia provider of block_cast (TileKernels' cast rule, any (bm, bk) block up to 128 x 128): the
Triton kernel of ../kernels/block_cast.py; wider blocks, and e2m1 with an odd bk other than 1, go to the oracle."""

from __future__ import annotations

from typing import Any

from portable_kernels.core.contract import checks_values
from portable_kernels.core.registry import Registry
from portable_kernels.ops.quant.block_cast import BLOCK_CAST, BlockCastInputs, nonfinite_error

from ._common import BACKEND, TRITON, TRITON_PRIORITY, kernel, triton_devices, triton_reasons

#: largest block edge the kernel holds in one program (kernels/block_cast.py MAX_BLOCK)
MAX_BLOCK = 128


def _fits(call: BlockCastInputs) -> bool:
    bm, bk = call.block
    return bm <= MAX_BLOCK and bk <= MAX_BLOCK and (call.element == "e4m3" or bk % 2 == 0 or bk == 1)


def _reasons(call: BlockCastInputs) -> list[str]:
    out = triton_reasons(call)
    if not _fits(call):
        out.append(f"block {call.block}: each edge at most {MAX_BLOCK}, and for e2m1 bk even or 1")
    return out


def _cast(call: BlockCastInputs) -> Any:
    data, scale, refused = kernel("block_cast").block_cast(call.x, tuple(call.block), call.element, call.round_sf,
                                                           call.clamp_min, call.sf)
    if checks_values(call.x) and bool(refused):  # the kernel's own pass found what the contract refuses
        raise nonfinite_error()
    return data, scale


def register(registry: Registry) -> None:
    registry.kernel(BLOCK_CAST.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                    check=_reasons, shape_class=_fits,
                    doc="Triton, TileKernels' rule (x * (max / amax)), e4m3 or packed e2m1")(_cast)
