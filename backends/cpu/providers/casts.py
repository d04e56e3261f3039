"""Native quantizers of the cpu backend (C++ in casts.cpp): FP8 per-token / per-block casts, the
FP4 per-token cast, SwiGLU fused with the per-token FP8 cast, and TileKernels' E5M6 cast — each one pass over memory,
emitting the PLAIN format (fp32 row-major scales), the cpu backend's own.

Plain functions of tensors first (validated here before the C++ runs), then the providers.
"""

from __future__ import annotations

from pathlib import Path

import torch

from portable_kernels.layouts.errors import LayoutConversionError
from portable_kernels.core.native.build import F32, I32, I64, PTR, NativeLibrary, num_threads, register_library
from portable_kernels.ops.quant.e5m6 import nonfinite_error
from portable_kernels.ops.quant.fp8 import refusing_nonfinite_ue8m0
from portable_kernels.core.tensors import cdiv

from .._names import BACKEND, NATIVE
from . import _checks as chk

LIB = register_library(NativeLibrary("cpu_casts", Path(__file__).parent.parent / "kernels" / "casts.cpp", {
    "pk_cast_fp8": [PTR, I32, I64, I64, I64, I64, I64, I32, PTR, PTR, I32],
    "pk_cast_fp4": [PTR, I32, I64, I64, I64, I32, PTR, PTR, I32],
    "pk_swiglu_cast": [PTR, I32, I64, I64, I64, I32, PTR, PTR, I64, PTR, I32, F32, PTR, PTR, PTR, I32],
    "pk_cast_e5m6": [PTR, I32, I64, I64, I64, I32, PTR, PTR, I32],
}, returns={"pk_cast_fp8": I64, "pk_cast_fp4": I64, "pk_swiglu_cast": I64, "pk_cast_e5m6": I64}, owner=BACKEND))

IN_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
FP8 = torch.float8_e4m3fn


def _lib(op: str):
    lib = LIB.get()
    if lib is None:
        raise RuntimeError(f"{op}: native casts unavailable: {LIB.reason()}")
    return lib


def _input(op: str, x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    chk.tensor(op, "x", x, tuple(IN_KINDS), None, "pass bf16, fp16 or fp32 values")
    if x.dim() not in dims:
        chk.fail(op, "x", f"{x.dim()}-D", f"{' or '.join(map(str, dims))} dims", "reshape to [..., rows, K]")
    return x.contiguous()  # a copy only when x is strided


def _positive(op: str, arg: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        chk.fail(op, arg, repr(value), "a positive int", "pass e.g. 128")
    return value


def cast_fp8(x: torch.Tensor, granularity: tuple[int, int], use_ue8m0: bool,
             op: str = "per_token_cast_to_fp8") -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., MN, K] (2 or 3 dims) -> (fp8 [..., MN, K], fp32 [..., ceil(MN/gm), ceil(K/gk)])."""
    lib = _lib(op)
    x = _input(op, x, (2, 3))
    gm, gk = (_positive(op, "granularity", g) for g in granularity)
    *lead, mn, k = x.shape
    q = torch.empty(x.shape, dtype=FP8)
    scale = torch.empty(*lead, cdiv(mn, gm), cdiv(k, gk), dtype=torch.float32)
    if x.numel():
        bad = lib.pk_cast_fp8(x.data_ptr(), IN_KINDS[x.dtype], lead[0] if lead else 1, mn, k, gm, gk, int(use_ue8m0),
                              q.data_ptr(), scale.data_ptr(), num_threads())
        _refuse_nonfinite(op, bad)
    return q, scale


def _refuse_nonfinite(op: str, bad: int) -> None:
    """The contract's error for blocks with NaN/Inf and no power-of-two scale (found in the kernel's pass)."""
    if bad:
        with refusing_nonfinite_ue8m0(op):
            raise LayoutConversionError(f"{bad} block(s) hold NaN or Inf values")


def cast_fp4(x: torch.Tensor, gran_k: int, use_ue8m0: bool,
             op: str = "per_token_cast_to_fp4") -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., M, K] (K even, finite) -> (uint8 [..., M, K/2] packed E2M1, fp32 [..., M, ceil(K/gran_k)])."""
    lib = _lib(op)
    x = _input(op, x, (2, 3))
    _positive(op, "gran_k", gran_k)
    *lead, m, k = x.shape
    if k % 2:
        chk.fail(op, "x", f"with odd K = {k}", "an even K", "pad K to an even length")
    q = torch.empty(*lead, m, k // 2, dtype=torch.uint8)
    scale = torch.empty(*lead, m, cdiv(k, gran_k), dtype=torch.float32)
    rows = x.numel() // k if k else 0
    if rows:
        bad = lib.pk_cast_fp4(x.data_ptr(), IN_KINDS[x.dtype], rows, k, gran_k, int(use_ue8m0), q.data_ptr(),
                              scale.data_ptr(), num_threads())
        if bad:  # E2M1 has no NaN/Inf code, whatever the scales
            chk.fail(op, "x", "a tensor with NaN or Inf values", "finite values",
                     "E2M1 has no NaN/Inf code; clean the input before quantizing")
    return q, scale


def cast_e5m6(x: torch.Tensor, num_per_channels: int, round_sf: bool,
              op: str = "per_token_cast_to_e5m6") -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K % 8 == 0) -> (uint8 [M, K * 3 / 2] packed E5M6, fp32 [M, ceil(K / num_per_channels)])."""
    lib = _lib(op)
    x = _input(op, x, (2,))
    per = _positive(op, "num_per_channels", num_per_channels)
    m, k = x.shape
    if k % 8:
        chk.fail(op, "x", f"with K = {k}", "K a multiple of 8", "pad K to a multiple of 8")
    q = torch.empty(m, k // 8 * 12, dtype=torch.uint8)
    scale = torch.empty(m, cdiv(k, per), dtype=torch.float32)
    if x.numel():
        bad = lib.pk_cast_e5m6(x.data_ptr(), IN_KINDS[x.dtype], m, k, per, int(round_sf), q.data_ptr(),
                               scale.data_ptr(), num_threads())
        if bad:
            raise nonfinite_error(op)
    return q, scale


def _row_map(op: str, arg: str, t: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    if t is None:
        return None
    chk.tensor(op, arg, t, (torch.int32,), (rows,), f"pass {arg} as int32 [M]")
    return t.contiguous()


def swiglu_cast(x: torch.Tensor, num_per_channels: int, round_sf: bool, pos_to_token_topk: torch.Tensor | None = None,
                topk_weights: torch.Tensor | None = None, pos_to_expert: torch.Tensor | None = None,
                swiglu_clamp_value: float | None = None,
                clamped_count: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """silu(x[:, :I])·x[:, I:] (· row weight), rows mapped to -1 zeroed, then FP8 per (1, num_per_channels):
    x [M, 2I] -> (fp8 [M, I], fp32 [M, ceil(I/num_per_channels)]); clamped_count int64 [3] += counts."""
    op = "swiglu_forward_and_per_token_cast"
    lib = _lib(op)
    x = _input(op, x, (2,))
    per = _positive(op, "num_per_channels", num_per_channels)
    m, two_i = x.shape
    if two_i % 2 or two_i == 0:
        chk.fail(op, "x", f"of shape {tuple(x.shape)}", "[M, 2I] with I >= 1", "pass the gate/up projection")
    inter = two_i // 2
    p2t = _row_map(op, "pos_to_token_topk", pos_to_token_topk, m)
    p2e = _row_map(op, "pos_to_expert", pos_to_expert, m)
    weights = None
    if topk_weights is not None:
        chk.tensor(op, "topk_weights", topk_weights, (torch.float32,), None, "pass fp32 router weights")
        weights = topk_weights.contiguous().view(-1)
    if (p2t is None) != (weights is None):
        chk.fail(op, "topk_weights", "given without pos_to_token_topk (or the reverse)", "both or neither",
                 "pass both weighting arguments")
    if clamped_count is not None:
        chk.tensor(op, "clamped_count", clamped_count, (torch.int64,), (3,), "pass torch.zeros(3, dtype=torch.int64)")
        chk.contiguous(op, "clamped_count", clamped_count)
        if swiglu_clamp_value is None:
            chk.fail(op, "clamped_count", "given without swiglu_clamp_value", "None", "pass swiglu_clamp_value")
    q = torch.empty(m, inter, dtype=FP8)
    scale = torch.empty(m, cdiv(inter, per), dtype=torch.float32)
    if m:
        clamp = swiglu_clamp_value is not None
        bad = lib.pk_swiglu_cast(x.data_ptr(), IN_KINDS[x.dtype], m, inter, per, int(round_sf), chk.ptr(p2t),
                                 chk.ptr(weights), 0 if weights is None else weights.numel(), chk.ptr(p2e), int(clamp),
                                 float(swiglu_clamp_value) if clamp else 0.0, chk.ptr(clamped_count), q.data_ptr(),
                                 scale.data_ptr(), num_threads())
        _refuse_nonfinite(op, bad)
    return q, scale


# -- providers ---------------------------------------------------------------------------------------------

def _available(call) -> list[str]:
    return [] if LIB.get() is not None else [f"native casts unavailable: {LIB.reason()}"]


def _fp8_convention(call) -> list[str]:
    # x / sf and x * (1 / sf) agree exactly when sf is a power of two; otherwise only the division is here
    if call.convention == "portable" or call.use_ue8m0:
        return []
    return [f"convention {call.convention!r} without UE8M0 scales: the C++ casts divide by the scale"]


def _fp4_convention(call) -> list[str]:
    if call.convention == "portable":
        return []
    return [f"convention {call.convention!r}: the C++ FP4 cast rounds ties to even and keeps the sign of zero"]


def register(registry) -> None:
    from portable_kernels.core.formats import PLAIN
    from portable_kernels.ops.quant.fp4 import PER_TOKEN_CAST_FP4
    from portable_kernels.ops.swiglu import SWIGLU_CAST
    from portable_kernels.ops.quant.e5m6 import PER_TOKEN_CAST_E5M6
    from portable_kernels.ops.quant.fp8 import PER_BLOCK_CAST, PER_TOKEN_CAST
    plain = {"out_format": (PLAIN,)}
    dtypes = {"x": tuple(IN_KINDS)}
    doc = "C++ (deepjit): one pass, amax and quantize per block while it is in cache"
    for contract in (PER_TOKEN_CAST, PER_BLOCK_CAST):
        registry.kernel(contract.name, BACKEND, NATIVE, priority=10, formats=plain, dtypes=dtypes, devices=("cpu",),
                        check=lambda call: _available(call) + _fp8_convention(call), doc=doc)(
            lambda call, op=contract.name: cast_fp8(call.x, call.granularity, call.use_ue8m0, op))
    registry.kernel(PER_TOKEN_CAST_FP4.name, BACKEND, NATIVE, priority=10, formats=plain, dtypes=dtypes,
                    devices=("cpu",), check=lambda call: _available(call) + _fp4_convention(call) + (
                        [] if call.granularity[0] == 1 else ["FP4 casts are per row (gran_mn 1)"]),
                    shape_class=lambda call: call.granularity[0] == 1, doc=doc)(
        lambda call: cast_fp4(call.x, call.granularity[1], call.use_ue8m0))
    registry.kernel(SWIGLU_CAST.name, BACKEND, NATIVE, priority=10, formats=plain, dtypes=dtypes, devices=("cpu",),
                    check=_available, doc="C++ (deepjit): SiLU·up, weights, clamp and the FP8 cast in one pass")(
        lambda call: swiglu_cast(call.x, call.num_per_channels, call.round_sf, call.pos_to_token_topk,
                                 call.topk_weights, call.pos_to_expert, call.swiglu_clamp_value, call.clamped_count))
    registry.kernel(PER_TOKEN_CAST_E5M6.name, BACKEND, NATIVE, priority=10, dtypes=dtypes, devices=("cpu",),
                    check=_available, doc="C++ (deepjit): amax, scale and the 12-bit codes packed per row in one pass")(
        lambda call: cast_e5m6(call.x, call.num_per_channels, call.round_sf))
