"""Native GEMMs of the cpu backend (C++ in gemm.cpp): D = C + A·Bᵀ over "segments" of rows.

Plain functions of tensors and static values; each validates every argument (dtypes, shapes,
strides, devices) before its C++ runs. A segment is (first row, rows, group): a dense GEMM is one
segment, a grouped GEMM one per group's run of valid rows, so padding rows are never touched.
Numerics: A and B are dequantized exactly as the contract's reference does (value·scale rounded to
fp32) and products accumulate in fp32, so results differ from the reference only by summation order.
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import threading
from pathlib import Path

import torch

from portable_kernels.core.native import build as native_build
from portable_kernels.core.native.build import I32, I64, PTR, NativeLibrary, num_threads, register_library
from portable_kernels.core.tensors import PreparedTensor

from .._names import BACKEND, NATIVE
from . import _checks as chk

LIB = register_library(NativeLibrary("cpu_gemm", Path(__file__).parent.parent / "kernels" / "gemm.cpp", {
    "pk_gemm": [PTR],                # one GemmCall (packed below)
    "pk_gemm_call_size": [],
    "pk_amx_available": [],
    "pk_gemm_vector_length": [],
}, returns={"pk_gemm": I32, "pk_gemm_call_size": I64, "pk_gemm_vector_length": I32, "pk_amx_available": I32},
    owner=BACKEND))

#: gemm.cpp's GemmCall: 29 native 64-bit words (Q: an address, 0 for null; q: an integer), in its order
_CALL = struct.Struct("=" + "".join((
    "QqQqqq",        # a, a_kind, sfa, a_gran_k, a_row_bytes, a_scale_ld
    "QqQqqqqqq",     # b, b_kind, sfb, b_gran_n, b_gran_k, b_row_bytes, b_scale_ld, b_group_bytes, b_group_scale
    "QqQq",          # d, d_bf16, c, c_bf16
    "Qqqqqqqqqq",    # segs, nsegs, m, N, K, engine, promo, fold_b, threads, fma_tile
)))
ENGINE_CODES = {"fma": 0, "amx": 1}


class _CallBuffer(threading.local):
    """This thread's GemmCall buffer: ctypes releases the GIL during the call, so threads that run
    GEMMs at the same time each pack into their own (allocated once per thread, never per call)."""

    def __init__(self) -> None:
        self.raw = ctypes.create_string_buffer(_CALL.size)
        self.address = ctypes.addressof(self.raw)


_buffer = _CallBuffer()

FP8 = torch.float8_e4m3fn
KIND_FP8, KIND_BF16, KIND_FP4 = 0, 1, 2
OUT_DTYPES = (torch.bfloat16, torch.float32)


def available() -> bool:
    return LIB.get() is not None


def dense_segments(m: int) -> torch.Tensor:
    return torch.tensor([[0, m, 0]], dtype=torch.int64)


_KINDS = {FP8: KIND_FP8, torch.bfloat16: KIND_BF16, torch.uint8: KIND_FP4}
_FP32 = (torch.float32,)
_F32 = torch.float32


def _kind(op: str, arg: str, data: torch.Tensor) -> int:
    kind = _KINDS.get(getattr(data, "dtype", None))
    if kind is None or not isinstance(data, torch.Tensor):
        chk.fail(op, arg, chk.describe(data), "fp8 e4m3, bf16, or uint8 (packed e2m1) data", "quantize the operand")
    if not data.is_cpu:
        chk.fail(op, arg, f"on {data.device}", "a CPU tensor (the cpu backend's native kernels)", f"move {arg} to the CPU")
    return kind


def _check_scale(op: str, arg: str, scale: torch.Tensor | None, kind: int, shape: tuple[int, ...]) -> None:
    if kind == KIND_BF16:
        if scale is not None:
            chk.fail(op, arg, "a scale for bf16 data", "None", "pass bf16 operands without scales")
        return
    if not chk.is_plain(scale, _FP32, shape):
        chk.tensor(op, arg, scale, _FP32, shape, "pass the fp32 row-major block scales")
        chk.contiguous(op, arg, scale)


def _check_segments(op: str, segments: torch.Tensor, m: int, g: int) -> None:
    chk.tensor(op, "segments", segments, (torch.int64,), None)
    chk.contiguous(op, "segments", segments)
    if segments.dim() != 2 or segments.shape[1] != 3:
        chk.fail(op, "segments", f"of shape {tuple(segments.shape)}", "[S, 3]", "pass (first row, rows, group) rows")
    if segments.numel():
        first, rows, grp = segments.unbind(1)
        if bool(((first < 0) | (rows < 0) | (first + rows > m) | (grp < 0) | (grp >= g)).any()):
            chk.fail(op, "segments", "out of range", f"rows within [0, {m}) and groups within [0, {g})",
                     "build segments from the validated layout")


def gemm_segments(op: str, a: torch.Tensor, sfa: torch.Tensor | None, a_gran_k: int,
                  b: torch.Tensor, sfb: torch.Tensor | None, b_gran: tuple[int, int],
                  d: torch.Tensor, c: torch.Tensor | None, segments: torch.Tensor | None, k: int, *,
                  engine: str = "auto", b_pow2: bool = False, fma_tile: bool = False) -> str:
    """D[rows of each segment] = C + A·B[group]ᵀ; returns the engine that ran ("fma" or "amx").

    a: fp8 or bf16 [M, K] (rows may be strided), sfa fp32 [M, ceil(K/a_gran_k)] or None for bf16
    b: fp8 / bf16 / uint8-packed e2m1 [G, N, K (K/2 packed)] contiguous; sfb fp32
       [G, ceil(N/b_gran[0]), ceil(K/b_gran[1])] or None for bf16
    d: bf16/fp32 [M, N] contiguous; c: None or fp32/bf16 [M, N] contiguous
    segments: int64 [S, 3] (first row, rows, group), rows within [0, M), groups within [0, G); None: one
        segment (0, M, 0) (a dense GEMM)
    engine: "fma" (dequantize B in L1, fp32 FMA), "amx" (raw bf16 tiles, per-block promotion) or
        "auto" (amx when this CPU has it and the granularities allow, else fma)
    b_pow2: every sfb is a power of two (e2m1 B: the amx engine then folds them into B's values)
    fma_tile: the fma engine dequantizes B into L1 tiles for segments of up to 4 rows (by default it
        dequantizes it in registers there; both give the same bytes, which tests compare); longer
        segments always run the panel path (an outer-product kernel, one FMA chain per output)
    """
    return _gemm(op, a, sfa, a_gran_k, b, sfb, b_gran, d, c, segments, k, engine, b_pow2, True, fma_tile)


def gemm_dense(op: str, a: torch.Tensor, sfa: torch.Tensor | None, a_gran_k: int,
               b: torch.Tensor, sfb: torch.Tensor | None, b_gran: tuple[int, int],
               d: torch.Tensor, c: torch.Tensor | None, k: int, *, engine: str = "auto",
               b_pow2: bool = False) -> str:
    """`gemm_segments` of one dense GEMM with b [N, K] and sfb [ceil(N/b_gran[0]), ceil(K/b_gran[1])]
    (no group dim, no segments tensor: the providers' per-call path builds no views)."""
    return _gemm(op, a, sfa, a_gran_k, b, sfb, b_gran, d, c, None, k, engine, b_pow2, False, False)


def _gemm(op: str, a: torch.Tensor, sfa: torch.Tensor | None, a_gran_k: int, b: torch.Tensor,
          sfb: torch.Tensor | None, b_gran: tuple[int, int], d: torch.Tensor, c: torch.Tensor | None,
          segments: torch.Tensor | None, k: int, engine: str, b_pow2: bool, grouped: bool, fma_tile: bool) -> str:
    # A small call (1x256x256) takes a few µs in C++, so the checks are written to read each tensor
    # attribute once (~0.1 µs apiece): a fast test of the common case, and on failure the
    # descriptive check, which raises the error naming the argument.
    lib = LIB.get()
    if lib is None:
        raise RuntimeError(f"{op}: native gemm unavailable: {LIB.reason()}")
    ka, kb = _kind(op, "a", a), _kind(op, "b", b)
    if ka == KIND_FP4:
        chk.fail(op, "a", "packed e2m1 data", "fp8 or bf16 activations", "quantize a with per_token_cast_to_fp8")
    b_shape = b.shape
    if grouped:
        if len(b_shape) != 3:
            chk.fail(op, "b", f"{len(b_shape)}-D", "[G, N, K] (a dense weight is b[None])", "add the group dim")
        g, n, kb_len = b_shape
    else:
        if len(b_shape) != 2:
            chk.fail(op, "b", f"{len(b_shape)}-D", "[N, K]", "pass the dense weight [N, K]")
        g, (n, kb_len) = 1, b_shape
    if not b.is_contiguous():
        chk.contiguous(op, "b", b)
    a_shape = a.shape
    if len(a_shape) != 2 or a_shape[1] != k:
        chk.fail(op, "a", f"of shape {tuple(a_shape)}", f"[M, K = {k}]", "pass A [M, K]")
    fp4 = kb == KIND_FP4
    if kb_len != (k // 2 if fp4 else k) or (fp4 and k % 2):
        chk.fail(op, "b", f"of shape {tuple(b_shape)}", f"[{'G, ' if grouped else ''}N, {k}] ({k // 2} bytes for "
                 "packed e2m1)", f"pass B [{'G, ' if grouped else ''}N, K] sharing A's K")
    m = a_shape[0]
    a_row = chk.row_stride(op, "a", a, a_shape)
    gn, gk = b_gran
    if a_gran_k < 1 or gk < 1 or (fp4 and (a_gran_k % 2 or gk % 2)):
        for name, gran in (("a granularity", a_gran_k), ("b granularity", gk)):
            if gran < 1 or (fp4 and gran % 2):
                chk.fail(op, name, gran, "a positive K granularity (even for e2m1)", "quantize with gran_k = 32 or 128")
    sfa_k, sfb_k, sfb_n = -(-k // a_gran_k), -(-k // gk), -(-n // gn)
    _check_scale(op, "sfa", sfa, ka, (m, sfa_k))
    _check_scale(op, "sfb", sfb, kb, (g, sfb_n, sfb_k) if grouped else (sfb_n, sfb_k))
    d_dtype = d.dtype if isinstance(d, torch.Tensor) else None
    if not (d_dtype in OUT_DTYPES and d.is_cpu and d.shape == (m, n) and d.is_contiguous()):
        chk.tensor(op, "d", d, OUT_DTYPES, (m, n), "allocate d [M, N] in bf16 or fp32")
        chk.contiguous(op, "d", d)
    if c is not None and not chk.is_plain(c, OUT_DTYPES, (m, n)):
        chk.tensor(op, "c", c, OUT_DTYPES, (m, n), "pass c [M, N] in fp32 or d's dtype")
        chk.contiguous(op, "c", c)
    if segments is None:
        seg_ptr, nsegs = 0, 1
    else:
        _check_segments(op, segments, m, g)
        seg_ptr, nsegs = segments.data_ptr(), segments.shape[0]
    fold = fp4 and bool(b_pow2)
    if engine == "fma":
        period = 0  # the fma engine reads no promotion period
    else:
        period = promotion_period(a_gran_k if sfa is not None else None, gk if (sfb is not None and not fold) else None)
        if engine == "auto":
            engine = "amx" if period is not None and amx_available() else "fma"
        if engine == "amx" and (period is None or not amx_available()):
            chk.fail(op, "engine", "'amx'", "an engine this CPU and these granularities allow",
                     "use engine='fma' (AMX-BF16 missing, or K granularities not multiples of 32)")
        if engine not in ENGINE_CODES:
            chk.fail(op, "engine", repr(engine), "'auto', 'fma' or 'amx'", "pass one of those")
    if m == 0 or n == 0 or nsegs == 0:
        return engine
    row_b = kb_len * 2 if kb == KIND_BF16 else kb_len  # b is contiguous: rows of kb_len elements, groups of n rows
    buf = _buffer
    _CALL.pack_into(buf.raw, 0,
                    a.data_ptr(), ka, 0 if sfa is None else sfa.data_ptr(), a_gran_k,
                    a_row * 2 if ka == KIND_BF16 else a_row, 0 if sfa is None else sfa_k,
                    b.data_ptr(), kb, 0 if sfb is None else sfb.data_ptr(), gn, gk, row_b,
                    0 if sfb is None else sfb_k, n * row_b, 0 if sfb is None else sfb_k * sfb_n,
                    d.data_ptr(), d_dtype == torch.bfloat16, 0 if c is None else c.data_ptr(),
                    c is not None and c.dtype == torch.bfloat16,
                    seg_ptr, nsegs, m, n, k, ENGINE_CODES[engine], period or 0, fold, num_threads(),
                    1 if fma_tile else 0)
    if lib.pk_gemm(buf.address):
        raise RuntimeError(f"{op}: the amx engine refused to run (no AMX tile permission)")
    return engine


# -- the amx engine (x86 with AMX-BF16): raw bf16 tiles, per-block promotion ---------------------------

#: K elements per tile step of the amx engine; promotion periods are multiples of it
AMX_K_STEP = 32
#: promotion period used when nothing is scaled (bf16 operands): only the K chunking needs it
AMX_UNSCALED_PERIOD = 512
_amx: dict[int, bool] = {}


def amx_available() -> bool:
    """The amx engine can run: the library (as built for this ISA) has it and the CPU granted AMX
    tile state to this process."""
    lib = LIB.get()
    if lib is None:
        return False
    known = _amx.get(id(lib))
    if known is None:
        known = _amx[id(lib)] = bool(lib.pk_amx_available())
    return known


def promotion_period(a_gran_k: int | None, b_gran_k: int | None) -> int | None:
    """K elements between promotions: the gcd of the scaled operands' K granularities when it is a
    multiple of the tile step, AMX_UNSCALED_PERIOD when nothing is scaled, else None (no amx)."""
    grans = [g for g in (a_gran_k, b_gran_k) if g]
    if not grans:
        return AMX_UNSCALED_PERIOD
    period = math.gcd(*grans)
    return period if period % AMX_K_STEP == 0 else None




# -- providers (cpu backend, "native") -------------------------------------------------------------------

#: segments with at most this many rows run the fma engine even where AMX exists: for a handful of
#: rows the bytes of B dominate, and the fma engine reads them with the least work per byte
FMA_MAX_ROWS = 4


def _engine_for(rows: int) -> str:
    return "fma" if rows <= FMA_MAX_ROWS else "auto"


def _unavailable() -> list[str]:
    return [] if LIB.get() is not None else [f"native GEMM library unavailable: {LIB.reason()}"]


def _per_row_a(call) -> list[str]:
    """A's scales must be per row (gran_mn 1); B may use any block shape."""
    reasons = _unavailable()
    a = call.a
    if isinstance(a, PreparedTensor) and a.storage_granularity[0] != 1:
        reasons.append(f"a is scaled per {a.storage_granularity} blocks; the native GEMM reads per-row "
                       "(1, gran_k) activation scales")
    return reasons


def fp8_gemm_nt_native(call) -> None:
    """GemmInputs with PLAIN e4m3 a, e4m3 (or e2m1) b: D = C + A·Bᵀ, exact per-block scaling."""
    a, b = call.a, call.b
    data = a.data
    b_gran = b.storage_granularity
    if _small_fp8_dense(data, a.scale, a.storage_granularity[1], b.data, b.scale, b_gran, call.d, call.c,
                        a.shape[-1]):
        return
    gemm_dense(FP8_OP, data, a.scale, a.storage_granularity[1], b.data, b.scale, tuple(b_gran),
               call.d, call.c, a.shape[-1], engine=_engine_for(data.shape[0]), b_pow2=b.ue8m0)


_TENSOR = torch.Tensor
_BF16 = torch.bfloat16


def _small_fp8_dense(a: torch.Tensor, sfa: torch.Tensor, a_gran_k: int, b: torch.Tensor, sfb: torch.Tensor,
                     b_gran: tuple[int, int], d: torch.Tensor, c: torch.Tensor | None, k: int) -> bool:
    """The decode-sized dense fp8 GEMM (M <= FMA_MAX_ROWS, both operands e4m3, contiguous, fp32 scales):
    every check `gemm_dense` makes for this case, each tensor attribute read once, then the same
    GemmCall it packs (the fma engine, register path). False, with nothing run, when any check
    fails or the call is another case: the caller then runs gemm_dense, whose checks name the problem.
    A 1x256x256 call takes a few µs in C++; the general path's checks cost about as much again."""
    lib = LIB.get()
    if lib is None or type(a) is not _TENSOR or type(b) is not _TENSOR or type(d) is not _TENSOR \
            or type(sfa) is not _TENSOR or type(sfb) is not _TENSOR:
        return False
    a_shape, b_shape, d_shape = a.shape, b.shape, d.shape
    if len(a_shape) != 2 or len(b_shape) != 2:
        return False
    (m, ka), (n, kb) = a_shape, b_shape
    gn, gk = b_gran
    if not (0 < m <= FMA_MAX_ROWS and n and ka == k and kb == k and a_gran_k >= 1 and gk >= 1 and gn >= 1):
        return False
    sfa_k, sfb_k = -(-k // a_gran_k), -(-k // gk)
    sfb_n = -(-n // gn)
    if not (a.dtype is FP8 and b.dtype is FP8 and a.is_cpu and b.is_cpu and a.is_contiguous() and b.is_contiguous()
            and sfa.dtype is _F32 and sfb.dtype is _F32 and sfa.is_cpu and sfb.is_cpu
            and sfa.shape == (m, sfa_k) and sfb.shape == (sfb_n, sfb_k)
            and sfa.is_contiguous() and sfb.is_contiguous()):
        return False
    d_dtype = d.dtype
    if not (d_dtype in OUT_DTYPES and d.is_cpu and d_shape == (m, n) and d.is_contiguous()):
        return False
    if c is not None and not chk.is_plain(c, OUT_DTYPES, (m, n)):
        return False
    buf = _buffer
    _CALL.pack_into(buf.raw, 0,
                    a.data_ptr(), KIND_FP8, sfa.data_ptr(), a_gran_k, k, sfa_k,
                    b.data_ptr(), KIND_FP8, sfb.data_ptr(), gn, gk, k, sfb_k, n * k, sfb_k * sfb_n,
                    d.data_ptr(), d_dtype is _BF16, 0 if c is None else c.data_ptr(),
                    c is not None and c.dtype is _BF16,
                    0, 1, m, n, k, ENGINE_CODES["fma"], 0, False, num_threads(), 0)
    if lib.pk_gemm(buf.address):
        raise RuntimeError(f"{FP8_OP}: the amx engine refused to run (no AMX tile permission)")
    return True


def bf16_gemm_nt_native(call) -> None:
    """GemmInputs with bf16 a, b: D = C + A·Bᵀ accumulated in fp32 (any d dtype, with c).

    The kernel reads K-contiguous rows; MN-major operands (DeepGEMM's wgrad passes A and B as
    transposed views) are copied to that order first, a copy of plain bf16 values, not a change of
    format."""
    a, b = call.a, call.b
    if a.stride(-1) != 1:
        a = a.contiguous()
    if not b.is_contiguous():
        b = b.contiguous()
    m, k = a.shape[0], a.shape[-1]
    gemm_dense(BF16_OP, a, None, AMX_UNSCALED_PERIOD, b, None, (1, 1), call.d, call.c, k, engine=_engine_for(m))


def bf16_gemm_nt_blas(call) -> None:
    """torch.matmul into d (oneDNN/MKL: the vendor BLAS torch ships) — bf16 d without c only, where
    its single rounding of the fp32 sum to bf16 is the contract's own."""
    if call.d.numel():
        torch.matmul(call.a, call.b.T, out=call.d)


def contiguous_segments(groups: torch.Tensor) -> torch.Tensor:
    """Runs of equal group ids >= 0 in a row -> group map: int64 [S, 3] (first row, rows, group)."""
    m = groups.shape[0]
    if m == 0:
        return torch.empty(0, 3, dtype=torch.int64)
    g = groups.to(torch.int64)
    change = torch.ones(m, dtype=torch.bool)
    change[1:] = g[1:] != g[:-1]
    starts = torch.nonzero(change).flatten()
    lengths = torch.diff(starts, append=torch.tensor([m]))
    seg = torch.stack((starts, lengths, g[starts]), 1)
    return seg[seg[:, 2] >= 0].contiguous()


def masked_segments(masked_m: torch.Tensor, max_m: int) -> torch.Tensor:
    """Group g's first masked_m[g] rows of the flattened [G * max_m] rows: int64 [S, 3]."""
    counts = masked_m.to(torch.int64).clamp(0, max_m)
    groups = torch.arange(counts.shape[0], dtype=torch.int64)
    seg = torch.stack((groups * max_m, counts, groups), 1)
    return seg[counts > 0].contiguous()


def _grouped_operands(call):
    a, b = call.a, call.b
    if isinstance(a, PreparedTensor):
        return a.data, a.scale, a.storage_granularity[1], b.data, b.scale, tuple(b.storage_granularity)
    # bf16 weights may arrive as a view (DeepGEMM's nn form hands over B [G, K, N] transposed): the
    # kernel walks contiguous rows of K, so such a B is copied here, where that constraint lives
    return a, None, AMX_UNSCALED_PERIOD, b.contiguous(), None, (1, 1)


def m_grouped_contiguous_native(call) -> None:
    """ContiguousGroupedInputs: one pass over every group's runs of rows; padding rows untouched."""
    from portable_kernels.ops.gemm.grouped import row_groups
    a, sfa, ga_k, b, sfb, gb = _grouped_operands(call)
    groups = row_groups(call.grouped_layout, call.use_psum_layout, call.alignment, call.d.shape[0])
    segs = contiguous_segments(groups)
    rows = int(segs[:, 1].max()) if segs.numel() else 0
    gemm_segments(call_op(call), a, sfa, ga_k, b, sfb, gb, call.d, None, segs, a.shape[-1], engine=_engine_for(rows))


def m_grouped_masked_native(call) -> None:
    """MaskedGroupedInputs: group g's first masked_m[g] rows; rows past them untouched."""
    a, sfa, ga_k, b, sfb, gb = _grouped_operands(call)
    g, max_m, k = a.shape
    segs = masked_segments(call.masked_m, max_m)
    rows = int(segs[:, 1].max()) if segs.numel() else 0
    d = call.d.view(g * max_m, call.d.shape[-1])
    gemm_segments(call_op(call), a.reshape(g * max_m, k), None if sfa is None else sfa.reshape(g * max_m, -1), ga_k,
                  b, sfb, gb, d, None, segs, k, engine=_engine_for(rows))


def call_op(call) -> str:
    fp8 = isinstance(call.a, PreparedTensor)
    masked = hasattr(call, "masked_m")
    return f"m_grouped_{'fp8' if fp8 else 'bf16'}_gemm_nt_{'masked' if masked else 'contiguous'}"


FP8_OP, BF16_OP = "fp8_gemm_nt", "bf16_gemm_nt"
PRIORITY = 10
DOC = "C++ (deepjit): AMX bf16 tiles with per-block fp32 promotion, or fp32 FMA for a few rows"


#: torch's bf16 matmul against the native engine, bf16 d, N=2048 K=7168, 1 thread, paired, medians
#: of 5 (benchmarks/cpu_provider_order.py; docs/cpu-backend.md "Provider order per ISA", 2026-12-02, Intel Xeon):
#: with bf16 hardware (AMX) torch-blas is 1.09x native at M=128 and native wins at M=1
#: (1.55x); restricted to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, PK_NATIVE_ISA=avx2) native is 3.0x torch-blas
#: at M=16 and 3.1x at M=128 (0.80x at M=1). So torch-blas goes first only where the CPU has bf16
#: matrix hardware that oneDNN may use.
BLAS_FIRST_WITH = frozenset({"amx", "avx512bf16"})
#: ONEDNN_MAX_CPU_ISA values that keep oneDNN off the bf16 hardware
ONEDNN_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def torch_bf16_has_hardware() -> bool:
    """Whether torch's bf16 matmul here runs on bf16 matrix hardware (AMX or AVX-512-BF16)."""
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in ONEDNN_WITHOUT_BF16:
        return False
    return bool(native_build.detected_isa()[1] & BLAS_FIRST_WITH)


def blas_priority(hardware: bool | None = None) -> int:
    """torch-blas above native where torch has bf16 hardware, below it elsewhere (see BLAS_FIRST_WITH).
    hardware: torch_bf16_has_hardware(), when the caller has it already."""
    hardware = torch_bf16_has_hardware() if hardware is None else hardware
    return PRIORITY + 10 if hardware else PRIORITY - 5


def register(registry) -> None:
    from portable_kernels.core.formats import PLAIN
    from portable_kernels.ops.gemm.fp4 import FP8_FP4_GEMM_NT
    from portable_kernels.ops.gemm.dense import BF16_GEMM_NT, FP8_GEMM_NT
    from portable_kernels.ops.gemm.grouped import (M_GROUPED_BF16_CONTIGUOUS, M_GROUPED_BF16_MASKED,
                                               M_GROUPED_FP8_CONTIGUOUS, M_GROUPED_FP8_MASKED)
    out = {"d": OUT_DTYPES}
    plain = {"a": (PLAIN,), "b": (PLAIN,)}
    for contract in (FP8_GEMM_NT, FP8_FP4_GEMM_NT):
        registry.kernel(contract.name, BACKEND, NATIVE, priority=PRIORITY, formats=plain, dtypes=out,
                        devices=("cpu",), check=_per_row_a, doc=DOC)(fp8_gemm_nt_native)
    hardware = torch_bf16_has_hardware()
    blas_doc = ("torch.matmul into d (the BLAS torch ships: oneDNN / MKL); bf16 d, no c; "
                + ("first: this CPU has bf16 matrix hardware" if hardware else
                   "after native: no bf16 matrix hardware here (native measured 3.0x at M>=16 on AVX2)"))
    registry.kernel(BF16_GEMM_NT.name, BACKEND, "torch-blas", priority=blas_priority(hardware),
                    dtypes={"a": (torch.bfloat16,), "b": (torch.bfloat16,), "d": (torch.bfloat16,)}, devices=("cpu",),
                    check=lambda call: [] if call.c is None else ["c is given: torch.matmul cannot add an fp32 "
                                                                  "accumulator before rounding to bf16"],
                    doc=blas_doc)(bf16_gemm_nt_blas)
    registry.kernel(BF16_GEMM_NT.name, BACKEND, NATIVE, priority=PRIORITY, dtypes=out, devices=("cpu",),
                    check=lambda call: _unavailable(), doc=DOC)(bf16_gemm_nt_native)
    for contract in (M_GROUPED_FP8_CONTIGUOUS, M_GROUPED_BF16_CONTIGUOUS):
        registry.kernel(contract.name, BACKEND, NATIVE, priority=PRIORITY, formats=plain, dtypes=out,
                        devices=("cpu",), check=_per_row_a,
                        doc=DOC)(m_grouped_contiguous_native)
    for contract in (M_GROUPED_FP8_MASKED, M_GROUPED_BF16_MASKED):
        registry.kernel(contract.name, BACKEND, NATIVE, priority=PRIORITY, formats=plain, dtypes=out,
                        devices=("cpu",), check=_per_row_a,
                        doc=DOC)(m_grouped_masked_native)
