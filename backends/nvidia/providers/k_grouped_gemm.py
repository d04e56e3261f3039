"""nvidia providers of the K-grouped GEMMs (k_grouped_fp8_gemm_{tn,nt}_contiguous,
k_grouped_bf16_gemm_tn_contiguous): one Triton kernel reading each group's span from
grouped_layout on the device (no host sync) and the per-channel scales as they are stored."""

from __future__ import annotations

from typing import Any

from portable_kernels.ops.gemm.k_grouped import K_GROUPED_BF16_TN, K_GROUPED_FP8_NT, K_GROUPED_FP8_TN, KGroupedInputs
from portable_kernels.core.registry import Registry

from ..kernels._checks import GEMM_BLOCK_K
from ._common import BACKEND, TRITON, TRITON_PRIORITY, kernel, triton_devices, triton_reasons


def _inner_contiguous(call: KGroupedInputs) -> tuple[bool, bool]:
    """Whether each operand's data is read as the kernel needs it: tn rows MN-contiguous, nt flat
    blocks contiguous."""
    if call.layout == "tn":
        return call.a.stride(-1) == 1, call.b.stride(-1) == 1
    return call.a.is_contiguous(), call.b.is_contiguous()


def _reasons(call: KGroupedInputs) -> list[str]:
    out = triton_reasons(call)
    if call.sfa is not None and call.gran_k not in GEMM_BLOCK_K:
        out.append(f"gran_k {call.gran_k}: the kernel tiles K by one scale block in {GEMM_BLOCK_K}")
    for arg, ok in zip("ab", _inner_contiguous(call)):
        if not ok:
            out.append(f"{arg} has strides {getattr(call, arg).stride()}: the kernel reads "
                       f"{'rows with MN contiguous' if call.layout == 'tn' else 'contiguous flat blocks'}")
    return out


def _k_grouped(call: KGroupedInputs) -> None:
    kernel("k_grouped").k_grouped_gemm(call.a, call.b, call.d, call.grouped_layout, call.c, layout=call.layout,
                                       sfa=call.sfa, sfb=call.sfb, gran_k=call.gran_k,
                                       use_psum_layout=call.use_psum_layout, alignment=call.alignment,
                                       ks=call.ks)


def _class(call: KGroupedInputs) -> Any:
    return _inner_contiguous(call)


def register(registry: Registry) -> None:
    for contract in (K_GROUPED_FP8_TN, K_GROUPED_FP8_NT, K_GROUPED_BF16_TN):
        registry.kernel(contract.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                        check=_reasons, shape_class=_class,
                        doc="Triton, per-group spans read on the device, per-channel scales in place")(_k_grouped)
