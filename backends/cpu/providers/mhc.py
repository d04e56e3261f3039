"""Native mHC stream kernels of the cpu backend (C++ in kernels/mhc.cpp): mhc_pre_apply_mix and
mhc_post and their backwards, one pass over the bf16 streams per token in fp32, each bf16 output
rounded once. The other mHC ops (expand, sinkhorn, the mixes, pre_norm_fn and their backwards) run
the contract's reference (plain torch)."""

from __future__ import annotations

from pathlib import Path

import torch

from portable_kernels.core.native.build import I32, I64, PTR, NativeLibrary, num_threads, register_library

from .._names import BACKEND, NATIVE

#: streams the native post backward holds per token (its accumulators are on the stack)
MAX_STREAMS = 16

LIB = register_library(NativeLibrary("cpu_mhc", Path(__file__).parent.parent / "kernels" / "mhc.cpp", {
    "pk_mhc_pre_apply_mix": [PTR, PTR, PTR, I64, I64, I64, I32],
    "pk_mhc_post": [PTR, PTR, PTR, PTR, PTR, I64, I64, I64, I32],
    "pk_mhc_pre_apply_mix_bwd": [PTR, PTR, PTR, PTR, PTR, I64, I64, I64, I32],
    "pk_mhc_post_bwd": [PTR, PTR, PTR, PTR, PTR, PTR, PTR, PTR, PTR, I64, I64, I64, I32],
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


def pre_apply_mix_backward_native(call) -> tuple[torch.Tensor, torch.Tensor]:
    """MhcInputs (o_grad bf16 [..., H], x bf16 [..., M, H], mix fp32 [..., M, 1]) -> (x_grad, mix_grad)."""
    g, x, mix = call.tensors
    m, h = x.shape[-2:]
    x_grad, mix_grad = torch.empty_like(x), torch.zeros_like(mix)
    if x.numel():
        _lib().pk_mhc_pre_apply_mix_bwd(g.data_ptr(), x.data_ptr(), mix.data_ptr(), x_grad.data_ptr(),
                                        mix_grad.data_ptr(), x.numel() // (m * h), m, h, num_threads())
    return x_grad, mix_grad


def post_backward_native(call) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MhcInputs (d_out, x, residual, post, comb) -> (d_x bf16, d_residual bf16, d_post fp32, d_comb fp32)."""
    g, x, residual, post, comb = call.tensors
    m, h = residual.shape[-2:]
    d_x, d_residual = torch.zeros_like(x), torch.empty_like(residual)
    d_post, d_comb = torch.zeros_like(post), torch.zeros_like(comb)
    if residual.numel():
        _lib().pk_mhc_post_bwd(g.data_ptr(), x.data_ptr(), residual.data_ptr(), post.data_ptr(), comb.data_ptr(),
                               d_x.data_ptr(), d_residual.data_ptr(), d_post.data_ptr(), d_comb.data_ptr(),
                               residual.numel() // (m * h), m, h, num_threads())
    return d_x, d_residual, d_post, d_comb


def _available(call) -> list[str]:
    return [] if LIB.get() is not None else [f"native mhc kernels unavailable: {LIB.reason()}"]


def _streams(call) -> list[str]:
    out = _available(call)
    m = call.tensors[2].shape[-2]
    if m > MAX_STREAMS:
        out.append(f"M = {m} > {MAX_STREAMS} streams: the native backward keeps its sums on the stack")
    return out


def _fits(call) -> bool:
    return call.tensors[2].shape[-2] <= MAX_STREAMS


def register(registry) -> None:
    from portable_kernels.ops.mhc.apply import MHC_POST, MHC_POST_BACKWARD, MHC_PRE_APPLY_MIX, MHC_PRE_APPLY_MIX_BACKWARD
    registry.kernel(MHC_PRE_APPLY_MIX.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_available,
                    doc="C++ (deepjit): Σ_m x · mix per token in fp32, 8 hidden values per AVX2 step")(
        pre_apply_mix_native)
    registry.kernel(MHC_POST.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_available,
                    doc="C++ (deepjit): x · post + combᵀ · residual per token in fp32, one pass over the streams")(
        post_native)
    registry.kernel(MHC_PRE_APPLY_MIX_BACKWARD.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_available,
                    doc="C++ (deepjit): x_grad = o_grad · mix and mix_grad = Σ_h o_grad · x in one pass")(
        pre_apply_mix_backward_native)
    registry.kernel(MHC_POST_BACKWARD.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_streams,
                    shape_class=_fits, doc="C++ (deepjit): the four gradients in one pass over d_out and the "
                                           f"streams (M <= {MAX_STREAMS})")(post_backward_native)
