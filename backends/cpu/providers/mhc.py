"""Native mHC stream kernels of the cpu backend (C++ in kernels/mhc.cpp): mhc_pre_apply_mix and
mhc_post, one pass over the bf16 streams per token in fp32, each output rounded once to bf16. The
other mHC ops (sinkhorn, the mixes, pre_norm_fn, every backward) run the contract's reference."""

from __future__ import annotations

from pathlib import Path

import torch

from portable_kernels.core.native.build import I32, I64, PTR, NativeLibrary, num_threads, register_library

from .._names import BACKEND, NATIVE

LIB = register_library(NativeLibrary("cpu_mhc", Path(__file__).parent.parent / "kernels" / "mhc.cpp", {
    "pk_mhc_pre_apply_mix": [PTR, PTR, PTR, I64, I64, I64, I32],
    "pk_mhc_post": [PTR, PTR, PTR, PTR, PTR, I64, I64, I64, I32],
}, owner=BACKEND))


def _lib():
    lib = LIB.get()
    if lib is None:
        raise RuntimeError(f"mhc: native kernels unavailable: {LIB.reason()}")
    return lib


def pre_apply_mix_native(call) -> torch.Tensor:
    """MhcInputs (x bf16 [..., M, H], mix fp32 [..., M, 1], contiguous) -> bf16 [..., H]."""
    x, mix = call.tensors
    m, h = x.shape[-2:]
    n = x.numel() // max(m * h, 1)
    out = torch.empty(*x.shape[:-2], h, dtype=torch.bfloat16)
    if out.numel() and m:
        _lib().pk_mhc_pre_apply_mix(x.data_ptr(), mix.data_ptr(), out.data_ptr(), n, m, h, num_threads())
    elif out.numel():
        out.zero_()
    return out


def post_native(call) -> torch.Tensor:
    """MhcInputs (x bf16 [..., H], residual bf16 [..., M, H], post fp32 [..., M, 1], comb fp32
    [..., M, M], contiguous) -> bf16 [..., M, H]."""
    x, residual, post, comb = call.tensors
    m, h = residual.shape[-2:]
    out = torch.empty_like(residual)
    if out.numel():
        n = residual.numel() // (m * h)
        _lib().pk_mhc_post(x.data_ptr(), residual.data_ptr(), post.data_ptr(), comb.data_ptr(), out.data_ptr(), n,
                           m, h, num_threads())
    return out


def _available(call) -> list[str]:
    return [] if LIB.get() is not None else [f"native mhc kernels unavailable: {LIB.reason()}"]


def register(registry) -> None:
    from portable_kernels.ops.mhc.apply import MHC_POST, MHC_PRE_APPLY_MIX
    registry.kernel(MHC_PRE_APPLY_MIX.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_available,
                    doc="C++ (deepjit): Σ_m x · mix per token in fp32, 8 hidden values per AVX2 step")(
        pre_apply_mix_native)
    registry.kernel(MHC_POST.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_available,
                    doc="C++ (deepjit): x · post + combᵀ · residual per token in fp32, one pass over the streams")(
        post_native)
