"""nvidia providers of the dense GEMMs (fp8_gemm_{nt,nn,tn,tt}, bf16_gemm_{nt,nn,tn,tt}, fp8_fp4_gemm_nt):
Triton kernels reading SM90/SM100 scales (the bf16 one any operand strides), torch._scaled_mm (cuBLASLt
block scaling, Hopper) and DeepGEMM.

The FP8 nn/tn/tt GEMMs run the nt kernel: their operands arrive as the nt views of the stored
transposes, and the SM90/SM100 Formats store an operand's data K-major with the scale storage of
the nt orientation (layouts/nvidia.py: the encode copies a transposed view to K-major once, at
ingest), so the nt kernel reads them as they lie."""

from __future__ import annotations

from typing import Any

import torch

from portable_kernels.ops.gemm.dense import BF16_GEMM_NT, FP8_GEMM_NT, GemmInputs
from portable_kernels.ops.gemm.transposed import BF16_CONTRACTS, FP8_CONTRACTS
from portable_kernels.layouts import SM90
from portable_kernels.ops.gemm.fp4 import FP8_FP4_GEMM_NT
from portable_kernels.core.providers import Limit
from portable_kernels.core.registry import Registry

from ..kernels._checks import GEMM_BLOCK_K
from ..vendor import deep_gemm, scaled_mm
from ._common import (BACKEND, LIBRARY_PRIORITY, NVIDIA_FORMATS, TORCH_VENDOR_PRIORITY, TRITON, TRITON_PRIORITY, kernel,
                      storage_granularity, triton_devices, triton_reasons)

OUT_DTYPES = (torch.bfloat16, torch.float32)
FP4_GRAN_K = (32, 128)


def _grans(call: GemmInputs) -> tuple[Any, Any]:
    return storage_granularity(call.a), storage_granularity(call.b)


def _fp8_reasons(call: GemmInputs) -> list[str]:
    (ga, gb) = _grans(call)
    out = triton_reasons(call)
    if ga[1] != gb[1] or ga[1] not in GEMM_BLOCK_K:
        out.append(f"K granularities a {ga[1]}, b {gb[1]}: the kernel tiles K by one shared scale block in "
                   f"{GEMM_BLOCK_K}")
    return out


def _k_major(call: GemmInputs) -> tuple[bool, bool]:
    return call.a.data.stride(-1) == 1, call.b.data.stride(-1) == 1


def _fp8_transposed_reasons(call: GemmInputs) -> list[str]:
    out = _fp8_reasons(call)
    for arg, k_major in zip("ab", _k_major(call)):
        if not k_major:  # only a hand-built PreparedTensor can hold MN-major data: the Formats store it K-major
            out.append(f"{arg}'s data has strides {getattr(call, arg).data.stride()}, not K-major as the "
                       f"{getattr(call, arg).format.name} Format stores it (build it with prepare_inputs)")
    return out


def _fp8_gemm(call: GemmInputs) -> None:
    a, b = call.a, call.b
    kernel("fp8_gemm").fp8_gemm_nt(a.data, a.scale, b.data, b.scale, call.d, call.c,
                                   gran_a=a.storage_granularity, gran_b=b.storage_granularity)


def _bf16_gemm(call: GemmInputs) -> None:
    """Every bf16 layout: the nn/tn/tt ops bind the .mT views of stored transposes, which the kernel
    reads through their strides (no copy)."""
    kernel("bf16_gemm").bf16_gemm_nt(call.a, call.b, call.d, call.c)


def _fp4_reasons(call: GemmInputs) -> list[str]:
    (ga, gb) = _grans(call)
    out = triton_reasons(call)
    if ga[0] != 1 or gb[0] != 1 or ga[1] not in FP4_GRAN_K or gb[1] not in FP4_GRAN_K:
        out.append(f"granularities a {ga}, b {gb}: the kernel takes per-row (1, 32 or 128) scales")
    return out


def _fp8_fp4_gemm(call: GemmInputs) -> None:
    a, b = call.a, call.b
    kernel("fp8_fp4_gemm").fp8_fp4_gemm_nt(a.data, a.scale, b.data, b.scale, call.d, call.c,
                                           gran_a=a.storage_granularity, gran_b=b.storage_granularity)


# -- vendor ---------------------------------------------------------------------------------------------


def _scaled_mm_reasons(call: GemmInputs) -> list[str]:
    dims = call.dims()
    ga, gb = _grans(call)
    out = scaled_mm.device_reasons(call.device)
    out += scaled_mm.reasons(dims["M"], dims["N"], dims["K"], call.a.scale, call.b.scale, ga, gb, call.d.dtype)
    return out


def _scaled_mm_shape(call: GemmInputs) -> Any:
    dims = call.dims()
    return (_grans(call), dims["M"] % scaled_mm.M_MULTIPLE == 0,
            -(-dims["K"] // 128) % scaled_mm.K_BLOCKS_MULTIPLE == 0)


def _scaled_mm(call: GemmInputs) -> None:
    a, b = call.a, call.b
    out_dtype = call.d.dtype if call.c is None else torch.float32
    scaled_mm.run(scaled_mm.call_arguments(a.data, a.scale, b.data, b.scale, b.storage_granularity, out_dtype),
                  call.d, call.c)


def _deep_gemm_reasons(call: GemmInputs) -> list[str]:
    missing = deep_gemm.unavailable_reason()
    return [missing] if missing else []


def _deep_gemm_fp8(call: GemmInputs) -> None:
    a, b = call.a, call.b
    deep_gemm.fp8_gemm_nt(a.data, a.scale, b.data, b.scale, call.d, call.c, a.storage_granularity,
                          b.storage_granularity).run()


def _deep_gemm_fp8_fp4(call: GemmInputs) -> None:
    a, b = call.a, call.b
    deep_gemm.fp8_fp4_gemm_nt(a.data, a.scale, b.data, b.scale, call.d, call.c, a.storage_granularity,
                              b.storage_granularity).run()


def _deep_gemm_bf16(call: GemmInputs) -> None:
    deep_gemm.bf16_gemm_nt(call.a, call.b, call.d, call.c).run()


def register(registry: Registry) -> None:
    quantized = {"a": NVIDIA_FORMATS, "b": NVIDIA_FORMATS}
    out = {"d": OUT_DTYPES}
    registry.kernel(FP8_GEMM_NT.name, BACKEND, TRITON, priority=TRITON_PRIORITY, formats=quantized, dtypes=out,
                    devices=triton_devices(), check=_fp8_reasons,
                    doc="Triton, block-scaled fp8 reading SM90/SM100 scales in place")(_fp8_gemm)
    for contract in FP8_CONTRACTS.values():
        registry.kernel(contract.name, BACKEND, TRITON, priority=TRITON_PRIORITY, formats=quantized, dtypes=out,
                        devices=triton_devices(), check=_fp8_transposed_reasons, shape_class=_k_major,
                        doc="Triton, the nt kernel on the K-major data and nt-oriented scales the Formats store")(
                            _fp8_gemm)
    for contract in (BF16_GEMM_NT, *BF16_CONTRACTS.values()):
        registry.kernel(contract.name, BACKEND, TRITON, priority=TRITON_PRIORITY, dtypes=out,
                        devices=triton_devices(), check=triton_reasons,
                        doc="Triton, bf16 with fp32 accumulation, operands of any strides")(_bf16_gemm)
    registry.kernel(FP8_FP4_GEMM_NT.name, BACKEND, TRITON, priority=TRITON_PRIORITY, formats=quantized, dtypes=out,
                    devices=triton_devices(), check=_fp4_reasons,
                    doc="Triton, E2M1 widened to e4m3 in registers")(_fp8_fp4_gemm)
    registry.kernel(FP8_GEMM_NT.name, BACKEND, "scaled_mm", priority=TORCH_VENDOR_PRIORITY,
                    formats={"a": (SM90,), "b": (SM90,)}, dtypes=out, devices=("cuda",),
                    limits=(Limit("K", multiple_of=scaled_mm.DIM_MULTIPLE),
                            Limit("N", multiple_of=scaled_mm.DIM_MULTIPLE)),
                    check=_scaled_mm_reasons, shape_class=_scaled_mm_shape,
                    doc="torch._scaled_mm 1x128 x 128x128 (cuBLASLt >= 12.9, Hopper); untested on a GPU")(_scaled_mm)
    for contract, fn in ((FP8_GEMM_NT, _deep_gemm_fp8), (FP8_FP4_GEMM_NT, _deep_gemm_fp8_fp4)):
        registry.kernel(contract.name, BACKEND, "deep_gemm", priority=LIBRARY_PRIORITY, formats=quantized,
                        dtypes=out, devices=("cuda",), check=_deep_gemm_reasons,
                        doc="delegates to deep_gemm when importable; untested on a GPU")(fn)
    registry.kernel(BF16_GEMM_NT.name, BACKEND, "deep_gemm", priority=LIBRARY_PRIORITY, dtypes=out, devices=("cuda",),
                    check=_deep_gemm_reasons, doc="delegates to deep_gemm when importable; untested on a GPU")(
                        _deep_gemm_bf16)
