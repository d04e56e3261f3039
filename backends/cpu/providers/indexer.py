"""Native lightning-indexer logits of the cpu backend (C++ in indexer.cpp): fp8_mqa_logits and
fp8_paged_mqa_logits, fp32 FMA vectors of the build's ISA over 64-key panels dequantized once per
group of query rows.

`mqa_logits_native(call)` / `paged_mqa_logits_native(call)` take the contracts' inputs values and
write only the valid entries of `call.logits`. Each validates the layout it reads (`*_problems`,
every reason) before the C++ runs; the registered check declines with the same sentences, so a
call this kernel cannot read (e.g. logits whose columns are not unit-stride) runs on "reference".
"""

from __future__ import annotations

import ctypes
import struct
import threading
from pathlib import Path
from typing import Any

import torch

from portable_kernels.core.errors import ContractError
from portable_kernels.core.native.build import I64, PTR, NativeLibrary, num_threads, register_library
from portable_kernels.core.tensors import describe

from .._names import BACKEND, NATIVE

LIB = register_library(NativeLibrary("cpu_indexer", Path(__file__).parent.parent / "kernels" / "indexer.cpp", {
    "pk_indexer_logits": [PTR],  # one IndexerCall (packed below)
    "pk_indexer_call_size": [],
    "pk_indexer_lanes": [],
}, returns={"pk_indexer_logits": I64, "pk_indexer_call_size": I64, "pk_indexer_lanes": I64}, owner=BACKEND))

#: indexer.cpp's IndexerCall: 28 native 64-bit words (Q: an address, 0 for null; q: an integer), in its order
_CALL = struct.Struct("=" + "".join((
    "Qqqq",      # q, rows, heads, d
    "Qqq",       # weights, w_bf16, w_stride
    "QQq",       # start, end, compressed
    "QQq",       # kv, sf, n (keys, or cache blocks)
    "Qq",        # lens, next_n
    "QQqqqq",    # cache, table, table_stride, table_cols, block_kv, block_stride (bytes)
    "Qqqqq",     # out, out_bf16, out_stride, width, threads
    "Qq",        # q_words (FP4), fp4
)))

FP8 = torch.float8_e4m3fn
FP4_PACKED = (torch.int8, torch.uint8)
FLOAT_DTYPES = (torch.float32, torch.bfloat16)


class _CallBuffer(threading.local):
    """This thread's IndexerCall buffer (ctypes releases the GIL during the call)."""

    def __init__(self) -> None:
        self.raw = ctypes.create_string_buffer(_CALL.size)
        self.address = ctypes.addressof(self.raw)


_buffer = _CallBuffer()


def lanes() -> int:
    """fp32 lanes of the built library's vectors (16 AVX-512, 8 AVX2, 4 NEON / generic); 0 if unbuilt."""
    lib = LIB.get()
    return int(lib.pk_indexer_lanes()) if lib is not None else 0


# -- what the kernel reads ------------------------------------------------------------------------

def _tensor(reasons: list[str], arg: str, t: Any, dtypes: tuple[torch.dtype, ...], shape: tuple[int, ...],
            contiguous: bool = True) -> bool:
    """Append why t is not a CPU tensor of `dtypes` and `shape` (contiguous when asked); True if fine."""
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes or tuple(t.shape) != shape:
        names = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        reasons.append(f"argument '{arg}' is {describe(t)}; the native kernel reads {names} {list(shape)}")
        return False
    if t.device.type != "cpu":
        reasons.append(f"argument '{arg}' is on {t.device}; the native kernel reads CPU tensors")
        return False
    if contiguous and not t.is_contiguous():
        reasons.append(f"argument '{arg}' has strides {t.stride()}; the native kernel reads it contiguous")
        return False
    return True


def _rows(reasons: list[str], arg: str, t: torch.Tensor) -> None:
    """t [rows, cols] has unit column stride and rows that do not overlap (any row stride)."""
    rows, cols = t.shape
    if cols > 1 and t.stride(1) != 1:
        reasons.append(f"argument '{arg}' has strides {t.stride()}; the native kernel reads and writes rows "
                       "with unit column stride")
    elif rows > 1 and t.stride(0) < cols:
        reasons.append(f"argument '{arg}' has row stride {t.stride(0)} < {cols} columns (overlapping rows)")


def _common(reasons: list[str], q: Any, dims: int, weights: Any, logits: Any,
            q_words: Any = None) -> tuple[int, int, int] | None:
    """(rows, heads, d) of a call the kernel may read, d the head dim (FP4: twice q's packed width)."""
    if LIB.get() is None:
        reasons.append(f"native indexer unavailable: {LIB.reason()}")
    if not isinstance(q, torch.Tensor) or q.dim() != dims:
        reasons.append(f"argument 'q' is {describe(q)}; the native kernel reads a {dims}-D float8_e4m3fn tensor")
        return None
    fp4 = q_words is not None
    if not _tensor(reasons, "q", q, FP4_PACKED if fp4 else (FP8,), tuple(q.shape)):
        return None
    if fp4 and not _tensor(reasons, "q_scales", q_words, (torch.int32,), tuple(q.shape[:-1])):
        return None
    rows = q.shape[0] * (q.shape[1] if dims == 4 else 1)
    heads, d = q.shape[-2], q.shape[-1] * (2 if fp4 else 1)
    if _tensor(reasons, "weights", weights, FLOAT_DTYPES, (rows, heads), contiguous=False):
        _rows(reasons, "weights", weights)
    if isinstance(logits, torch.Tensor) and logits.dim() == 2 and logits.shape[0] == rows:
        if _tensor(reasons, "logits", logits, FLOAT_DTYPES, tuple(logits.shape), contiguous=False):
            _rows(reasons, "logits", logits)
            if isinstance(weights, torch.Tensor) and weights.dtype == torch.bfloat16 \
                    and logits.dtype != torch.bfloat16:
                reasons.append("bf16 weights come with bf16 logits (the contract's rule)")
    else:
        reasons.append(f"argument 'logits' is {describe(logits)}; the native kernel writes [{rows}, width]")
    return rows, heads, d


def mqa_logits_problems(call) -> list[str]:
    """Every reason the native kernel cannot read or write this MqaLogitsInputs (empty: it can)."""
    reasons: list[str] = []
    fp4 = call.q_scales is not None
    dims = _common(reasons, call.q, 3, call.weights, call.logits, call.q_scales)
    if dims is None:
        return reasons
    m, _, d = dims
    kv = call.kv
    n = kv.shape[0] if isinstance(kv, torch.Tensor) and kv.dim() == 2 else -1
    if _tensor(reasons, "kv", kv, FP4_PACKED if fp4 else (FP8,), (n, d // 2 if fp4 else d)):
        _tensor(reasons, "kv_scales", call.kv_scales, (torch.int32 if fp4 else torch.float32,), (n,))
    for arg in ("k_start", "k_end"):
        _tensor(reasons, arg, getattr(call, arg), (torch.int32,), (m,))
    return reasons


def paged_mqa_logits_problems(call) -> list[str]:
    """Every reason the native kernel cannot read or write this PagedMqaLogitsInputs (empty: it can)."""
    reasons: list[str] = []
    dims = _common(reasons, call.q, 4, call.weights, call.logits, call.q_scales)
    if dims is None:
        return reasons
    batch, next_n = call.q.shape[:2]
    d = call.q.shape[-1]  # bytes of a key row: D (FP8) or D/2 (FP4)
    cache = call.kv_cache
    if _tensor(reasons, "kv_cache", cache, (torch.uint8,), tuple(getattr(cache, "shape", ())), contiguous=False):
        if cache.dim() != 4 or cache.shape[2] != 1 or cache.shape[3] != d + 4:
            reasons.append(f"argument 'kv_cache' is {describe(cache)}; the native kernel reads "
                           f"[blocks, block_kv, 1, {d} + 4] (layouts.indexer_cache)")
        elif cache.stride(3) != 1 or cache.stride(1) != d + 4 or cache.stride(0) < cache.shape[1] * (d + 4):
            reasons.append(f"argument 'kv_cache' has strides {cache.stride()}; the native kernel reads blocks of "
                           f"{cache.shape[1]} x {d + 4} contiguous bytes (layouts.indexer_cache)")
    _tensor(reasons, "context_lens", call.context_lens, (torch.int32,), (batch, next_n))
    table = call.block_table
    if isinstance(table, torch.Tensor) and table.dim() == 2 and table.shape[0] == batch:
        if _tensor(reasons, "block_table", table, (torch.int32,), tuple(table.shape), contiguous=False) \
                and table.shape[1] > 1 and table.stride(1) != 1:
            reasons.append(f"argument 'block_table' has strides {table.stride()}; the native kernel reads rows "
                           "with unit column stride")
    else:
        reasons.append(f"argument 'block_table' is {describe(table)}; the native kernel reads int32 [{batch}, blocks]")
    return reasons


def _unit_rows(t: torch.Tensor) -> bool:
    rows, cols = t.shape[0], t.shape[-1]
    return (cols <= 1 or t.stride(-1) == 1) and (rows <= 1 or t.stride(0) >= cols)


def _layout(call, dense: tuple[str, ...], rowwise: tuple[str, ...]) -> tuple:
    """What the checks look at beyond dtypes and devices (the dispatch signature holds those)."""
    try:
        return (tuple(getattr(call, a).is_contiguous() for a in dense),
                tuple(_unit_rows(getattr(call, a)) for a in rowwise))
    except Exception:  # not tensors: the check gives the reasons
        return ("unreadable",)


def _mqa_layout(call) -> tuple:
    return _layout(call, ("q", "kv", "kv_scales", "k_start", "k_end"), ("weights", "logits"))


def _paged_layout(call) -> tuple:
    cache = call.kv_cache
    blocks_ok = isinstance(cache, torch.Tensor) and cache.dim() == 4 and cache.stride(3) == 1 \
        and cache.stride(1) == cache.shape[3] and cache.stride(0) >= cache.shape[1] * cache.shape[3]
    return _layout(call, ("q", "context_lens"), ("weights", "logits", "block_table")) + (blocks_ok,)


def _refuse(op: str, reasons: list[str]) -> None:
    raise ContractError(f"{op} (cpu native): " + "; ".join(reasons))


def _launch(op: str, q: torch.Tensor, rows: int, weights: torch.Tensor, logits: torch.Tensor, *, start=None,
            end=None, compressed=False, kv=None, sf=None, n=0, lens=None, next_n=0, cache=None, table=None,
            block_kv=0, q_words=None) -> int:
    heads, d = q.shape[-2], q.shape[-1] * (1 if q_words is None else 2)
    buf = _buffer
    _CALL.pack_into(buf.raw, 0, q.data_ptr(), rows, heads, d,
                    weights.data_ptr(), weights.dtype == torch.bfloat16, weights.stride(0),
                    0 if start is None else start.data_ptr(), 0 if end is None else end.data_ptr(), compressed,
                    0 if kv is None else kv.data_ptr(), 0 if sf is None else sf.data_ptr(), n,
                    0 if lens is None else lens.data_ptr(), next_n,
                    0 if cache is None else cache.data_ptr(), 0 if table is None else table.data_ptr(),
                    0 if table is None else table.stride(0), 0 if table is None else table.shape[1], block_kv,
                    0 if cache is None else cache.stride(0),
                    logits.data_ptr(), logits.dtype == torch.bfloat16, logits.stride(0), logits.shape[1],
                    num_threads(), 0 if q_words is None else q_words.data_ptr(), q_words is not None)
    return int(LIB.get().pk_indexer_logits(buf.address))


def mqa_logits_native(call) -> None:
    """MqaLogitsInputs: the valid entries of call.logits (fp32 or bf16), columns j (or j - k_start[i]
    when compressed)."""
    op = "fp8_mqa_logits"
    reasons = mqa_logits_problems(call)
    if reasons:
        _refuse(op, reasons)
    if call.q.shape[0] == 0 or call.logits.shape[1] == 0:
        return
    bad = _launch(op, call.q, call.q.shape[0], call.weights, call.logits, start=call.k_start, end=call.k_end,
                  compressed=bool(call.compressed), kv=call.kv, sf=call.kv_scales, n=call.kv.shape[0],
                  q_words=call.q_scales)
    if bad:
        _refuse(op, [f"{bad} rows have a key range outside [0, {call.kv.shape[0]}) or wider than the logits "
                     f"({call.logits.shape[1]} columns); they were not written"])


def paged_mqa_logits_native(call) -> None:
    """PagedMqaLogitsInputs: the valid entries of call.logits, key j of sequence b read from cache block
    block_table[b, j // block_kv], slot j % block_kv. schedule_meta is not read (the kernel splits the
    work for this machine's threads itself)."""
    op = "fp8_paged_mqa_logits"
    reasons = paged_mqa_logits_problems(call)
    if reasons:
        _refuse(op, reasons)
    batch, next_n = call.q.shape[:2]
    if batch * next_n == 0 or call.logits.shape[1] == 0:
        return
    cache = call.kv_cache
    bad = _launch(op, call.q, batch * next_n, call.weights, call.logits, n=cache.shape[0], lens=call.context_lens,
                  next_n=next_n, cache=cache, table=call.block_table, block_kv=cache.shape[1], q_words=call.q_scales)
    if bad:
        _refuse(op, [f"{bad} context lengths exceed the logits width ({call.logits.shape[1]}) or keys reference a "
                     f"block outside the table or the cache ({cache.shape[0]} blocks)"])


def register(registry) -> None:
    from portable_kernels.ops.attention.indexer import MQA_LOGITS, PAGED_MQA_LOGITS
    doc = ("C++ (deepjit): fp32 FMA vectors of the build's ISA over 64-key panels, each dequantized once per "
           "group of query rows; rows and key chunks in parallel")
    registry.kernel(MQA_LOGITS.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=mqa_logits_problems,
                    shape_class=_mqa_layout, doc=doc)(mqa_logits_native)
    registry.kernel(PAGED_MQA_LOGITS.name, BACKEND, NATIVE, priority=10, devices=("cpu",),
                    check=paged_mqa_logits_problems, shape_class=_paged_layout, doc=doc)(paged_mqa_logits_native)
