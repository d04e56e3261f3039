"""Triton helpers shared by the nvidia kernels: scale loads in the sm90/sm100 formats, rounding
casts, and the interpreter switch.

Importing this module imports Triton and fixes the run mode (runtime.note_mode). Two interpreter
traps are handled here, each behind the `INTERPRET` constexpr so the GPU keeps its native code:
- the interpreter computes bf16 `tl.dot` wrongly: operands are upcast to fp32 first (exact);
- the interpreter's float casts round ties away from zero (fp32 -> fp8 also does not saturate,
  and fp32 -> bf16 truncates): casts use bit-exact round-to-nearest-even code instead. On the GPU
  the hardware conversions (cvt.rn[.satfinite]) are used; both round to nearest even, and every
  quantizer clamps to ±448 before casting, so both paths give the bytes torch gives.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

import triton
import triton.language as tl

from . import runtime

#: whether the kernels of this process run in Triton's interpreter (decided at decoration)
INTERPRET: bool = bool(triton.knobs.runtime.interpret)
runtime.note_mode(INTERPRET)

_F = TypeVar("_F", bound=Callable[..., Any])
_INTERPRETER_LOCK = threading.RLock()


def serialized(fn: _F) -> _F:
    """Launch functions run one at a time in interpreter mode: Triton's interpreter patches
    triton.language globally for each launch, so two threads launching at once break each other
    (seen as "Did you forget to add @triton.jit?"). Compiled launches are left concurrent."""
    if not INTERPRET:
        return fn

    @functools.wraps(fn)
    def one_at_a_time(*args: Any, **kwargs: Any) -> Any:
        with _INTERPRETER_LOCK:
            return fn(*args, **kwargs)
    return one_at_a_time  # type: ignore[return-value]


#: fp32 exponent bias, and the e4m3 one
_F32_BIAS = 127
_E4M3_BIAS = 7


@triton.jit
def e4m3_codes(x, INTERPRET: tl.constexpr):
    """uint8 e4m3fn codes of fp32 `x` (|x| <= 448 or NaN), rounded to nearest, ties to even; NaN -> 0x7F | sign."""
    if INTERPRET:
        bits = x.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80
        mag_bits = bits & 0x7FFFFFFF
        mag = mag_bits.to(tl.float32, bitcast=True)
        # normal range: keep 3 mantissa bits, ties to even; a carry moves into the exponent
        rounded = mag_bits + 0x7FFFF + ((mag_bits >> 20) & 1)
        normal = (rounded >> 20) - ((127 - 7) << 3)
        # below 2^-6 (subnormal e4m3, steps of 2^-9): the FPU rounds mag * 2^9 + 2^23 to an integer
        sub = (mag * 512.0 + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
        code = tl.where(mag < 0.015625, sub, normal)
        code = tl.where(mag != mag, 0x7F, code) | sign  # NaN keeps its sign, like torch's cast
        return code.to(tl.uint8)
    else:
        return x.to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def to_bf16(x, INTERPRET: tl.constexpr):
    """bf16 of fp32 `x`, rounded to nearest even (NaN and inf kept)."""
    if INTERPRET:
        bits = x.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def to_half(x, FP16: tl.constexpr, INTERPRET: tl.constexpr):
    """fp16 (FP16) or bf16 of fp32 `x`, rounded to nearest even. The interpreter's fp16 cast is
    numpy's, which already rounds to nearest even; only bf16 needs the software rounding."""
    if FP16:
        return x.to(tl.float16)
    else:
        return to_bf16(x, INTERPRET)


@triton.jit
def to_out(x, OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr):
    """An fp32 result converted for a bf16 or fp32 output."""
    if OUT_BF16:
        return to_bf16(x, INTERPRET)
    else:
        return x


@triton.jit
def dot(a, b, acc, INTERPRET: tl.constexpr):
    """acc + a @ b with fp32 accumulation; in the interpreter on exact fp32 upcasts."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def load_scales(ptr, mn, kb, stride_mn, stride_k, mask, PACKED: tl.constexpr):
    """fp32 scales of rows `mn` (a vector of scale rows) at K-block `kb` (a scalar).

    PACKED=False: fp32 storage (sm90, or plain), element (mn, kb) at mn*stride_mn + kb*stride_k.
    PACKED=True: sm100 UE8M0, four K-blocks per int32 word (mn, kb // 4), byte kb % 4 of it
    (little-endian), value 2^(e - 127).
    """
    if PACKED:
        word = tl.load(ptr + mn * stride_mn + (kb // 4) * stride_k, mask=mask, other=0)
        e = (word >> ((kb % 4) * 8)) & 0xFF
        return (e << 23).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr + mn * stride_mn + kb * stride_k, mask=mask, other=0.0)


@triton.jit
def ceil_ue8m0(sf):
    """fp32 scales rounded up to a power of two, exponent clamped to [1, 254] (layouts.ceil_to_ue8m0)."""
    bits = sf.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    e = tl.minimum(tl.maximum(e, 1), 254)
    return (e << 23).to(tl.float32, bitcast=True)


@triton.jit
def block_scale(amax, nonfinite, floor, fp_max, UE8M0: tl.constexpr):
    """The contract's block scale: max(amax, floor) / fp_max (IEEE division), rounded up to a power
    of two with UE8M0. A block holding NaN gets a NaN scale (as torch's amax propagates it); with
    UE8M0 a block holding NaN or Inf has no scale and gets NaN too (exponent byte 0xFF), which
    the provider turns into the contract's error where values are checked."""
    sf = tl.math.div_rn(tl.maximum(amax, floor, propagate_nan=tl.PropagateNan.ALL), fp_max)
    if UE8M0:
        sf = tl.where(nonfinite > 0, float("nan"), ceil_ue8m0(sf))
    return sf


@triton.jit
def nonfinite_rows(x):
    """Per row of a 2-D tile: (whether it holds NaN, whether it holds NaN or Inf), as int32."""
    nan = tl.max((x != x).to(tl.int32), axis=1)
    inf = tl.max((tl.abs(x) == float("inf")).to(tl.int32), axis=1)
    return nan, tl.maximum(nan, inf)


@triton.jit
def ue8m0_byte(sf):
    """The exponent byte of a power-of-two fp32 scale."""
    return ((sf.to(tl.int32, bitcast=True) >> 23) & 0xFF).to(tl.uint8)
