"""Native MLA decode of the cpu backend (C++ in mla.cpp): flash_mla_with_kvcache over a bf16 or FP8
(656-byte rows, or FlashMLA's MODEL1 584-byte-per-token pages with d = 512) paged cache, dense (causal or not) or sparse, split over the sequence with an lse merge;
and this backend's get_mla_metadata: the split plan. (The library also runs flash_mla_sparse_fwd:
mla_prefill.py.)

Two engines: AMX (bf16 tiles, mla_amx.h) where the CPU has AMX-BF16, else FMA (fp32 vectors,
mla_fma.h) on every other CPU: AVX-512, AVX2, NEON or the generic build. MODEL1 pages run on FMA
(AMX's key loader reads 656-byte rows only).

The plan (`mla_split_plan`) cuts every job — (sequence, KV head) for dense decode, (sequence, query
token) for sparse — into key ranges so that the machine's threads get about two tasks each and no
task is shorter than MIN_SPLIT_KEYS; its tensors are int64 [tasks, 4] = (job, first key, end key,
partial slot) and num_splits int32 [b + 1] (tasks per sequence, prefix-summed like FlashMLA's).
"""

from __future__ import annotations

from pathlib import Path

import torch

from portable_kernels.layouts.kv_cache_model1 import MODEL1_BYTES_PER_TOKEN, model1_cache_problem
from portable_kernels.ops.attention.decode import reject_bad_cache_references
from portable_kernels.core.native.build import F32, I32, I64, PTR, NativeLibrary, num_threads, register_library
from portable_kernels.core.tensors import cdiv

from .._names import BACKEND, NATIVE
from . import _checks as chk

LIB = register_library(NativeLibrary("cpu_mla", Path(__file__).parent.parent / "kernels" / "mla.cpp", {
    "pk_mla_engines": [],
    "pk_mla_decode": [PTR, I64, I64, I64, I64, I64,            # q, b, s_q, h_q, d, h_kv
                      PTR, I32, I64, I64, I64, I64, I64,        # cache, fp8, blocks, block_size, strides (bytes)
                      PTR, I64, PTR, PTR, I64, F32, I32,        # block_table, max_blocks, seqlens, indices, topk, scale, causal
                      PTR, I64, I64, PTR, PTR, I32, I32],       # splits, nsplits, nslots, out, lse, threads, engine
    "pk_mla_sparse_prefill": [PTR, I64, I64, I64, PTR, I64, I64,   # q, s_q, h_q, d, kv, s_kv, kv row bytes
                              PTR, I64, PTR, PTR, F32,             # indices, topk, topk_length, sink, scale
                              PTR, I64, I64, PTR, PTR, PTR, I32, I32],  # splits, nsplits, nslots, out, max, lse, ..
}, returns={"pk_mla_engines": I32, "pk_mla_decode": I32, "pk_mla_sparse_prefill": I32}, owner=BACKEND))

#: the engines, by the bit pk_mla_engines reports and the number pk_mla_decode takes
ENGINES = {"fma": 1, "amx": 2}

#: no task is cut shorter than this many keys (a chunk is 64 keys; shorter splits cost their merge)
MIN_SPLIT_KEYS = 512
#: tasks per thread the plan aims for (some slack for uneven sequence lengths)
TASKS_PER_THREAD = 2
#: the last split of every job ends here, so a plan reused after its sequences grew still covers them
OPEN_END = 2 ** 62


def engines() -> tuple[str, ...]:
    """The engines this build and CPU can run ("fma" wherever the library built, "amx" with AMX-BF16)."""
    lib = LIB.get()
    bits = lib.pk_mla_engines() if lib is not None else 0
    return tuple(name for name, bit in ENGINES.items() if bits & bit)


def available() -> bool:
    return bool(engines())


def engine() -> str:
    """The engine a call runs by default: AMX where the CPU has it, else FMA."""
    have = engines()
    return "amx" if "amx" in have else "fma"


def mla_split_plan(job_keys: list[int], jobs_per_batch: int, threads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split every job's keys into ranges: (splits int64 [S, 4], num_splits int32 [b + 1])."""
    total = sum(job_keys)
    tasks = max(len(job_keys), TASKS_PER_THREAD * threads)
    step = max(MIN_SPLIT_KEYS, cdiv(max(total, 1), tasks))
    step = cdiv(step, 64) * 64
    rows, per_batch, slot = [], [0] * (len(job_keys) // max(jobs_per_batch, 1)), 0
    for job, keys in enumerate(job_keys):
        n = max(1, cdiv(keys, step))
        for s in range(n):
            end = OPEN_END if s == n - 1 else (s + 1) * step
            rows.append((job, s * step, end, slot if n > 1 else -1))
            slot += n > 1
        per_batch[job // jobs_per_batch] += n
    splits = torch.tensor(rows, dtype=torch.int64).reshape(-1, 4)
    num_splits = torch.zeros(len(per_batch) + 1, dtype=torch.int32)
    num_splits[1:] = torch.cumsum(torch.tensor(per_batch, dtype=torch.int32), 0)
    return splits, num_splits


def _jobs(b: int, s_q: int, h_kv: int, cache_seqlens: torch.Tensor | None, topk: int | None) -> tuple[list[int], int]:
    if topk is not None:
        return [topk] * (b * s_q), s_q
    lengths = cache_seqlens.tolist()
    return [int(lengths[i]) for i in range(b) for _ in range(h_kv)], h_kv


def metadata_native(call) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """MlaMetadataInputs -> ((splits,), num_splits) for this machine's threads."""
    b = call.cache_seqlens.shape[0]
    h_kv = call.num_heads_k
    s_q = call.num_q_tokens_per_head_k * h_kv // call.num_heads_q if call.num_heads_q else 1
    keys, per_batch = _jobs(b, s_q, h_kv, call.cache_seqlens, call.topk)
    splits, num_splits = mla_split_plan(keys, per_batch, num_threads())
    return (splits,), num_splits


def metadata_fake(call) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """metadata_native's outputs on torch.compile's fake tensors: the task count depends on the lengths."""
    tasks = torch.library.get_ctx().new_dynamic_size()
    seqlens = call.cache_seqlens
    return ((seqlens.new_empty((tasks, 4), dtype=torch.int64),),
            seqlens.new_empty((seqlens.shape[0] + 1,), dtype=torch.int32))


def _plan_for(call, b: int, s_q: int, h_kv: int) -> torch.Tensor:
    """The split plan of the metadata when it was made for this call's jobs, else a fresh one."""
    meta = call.tile_scheduler_metadata
    tensors = getattr(meta, "tensors", ())
    topk = None if call.indices is None else call.indices.shape[-1]
    jobs = b * s_q if topk is not None else b * h_kv
    if tensors and tensors[0].dim() == 2 and tensors[0].shape[1] == 4 and tensors[0].numel() \
            and int(tensors[0][-1, 0]) == jobs - 1:
        return tensors[0].contiguous()
    keys, per_batch = _jobs(b, s_q, h_kv, call.cache_seqlens, topk)
    return mla_split_plan(keys, per_batch, num_threads())[0]


def decode_native(call, engine: str | None = None) -> None:
    """MlaDecodeInputs: writes call.out (bf16 [b, s_q, h_q, 512]) and call.lse (fp32 [b, h_q, s_q]).
    engine: "fma" or "amx" (one of engines()); None runs the default (engine())."""
    op = "flash_mla_with_kvcache"
    lib = LIB.get()
    if lib is None:
        raise RuntimeError(f"{op}: native MLA unavailable here: {LIB.reason()}")
    model1 = call.is_fp8_kvcache and call.k_cache.shape[-1] == MODEL1_BYTES_PER_TOKEN
    if model1 and engine == "amx":
        raise ValueError(f"{op}: engine='amx' reads 656-byte rows only; MODEL1 pages run on engine='fma'")
    if engine is not None and engine not in engines():
        raise ValueError(f"{op}: engine={engine!r} cannot run here; this CPU and build run {engines()}")
    reject_bad_cache_references(call)  # the contract's rule, before any cache byte is read
    q, cache = call.q.contiguous(), call.k_cache
    b, s_q, h_q, d = q.shape
    nblocks, block_size, h_kv = cache.shape[:3]
    if model1 and model1_cache_problem(cache) is not None:
        chk.fail(op, "k_cache", f"MODEL1 pages with strides {cache.stride()}", "each page's bytes contiguous",
                 model1_cache_problem(cache))
    if cache.stride(-1) != 1:
        chk.fail(op, "k_cache", f"with strides {cache.stride()}", "contiguous channels", "store tokens contiguously")
    for name, t in (("out", call.out), ("lse", call.lse)):
        chk.contiguous(op, name, t)
    if b == 0 or s_q == 0 or h_q == 0:
        return
    elem = cache.element_size()
    bt = call.block_table.contiguous() if call.block_table is not None else None
    seqlens = call.cache_seqlens.contiguous() if call.cache_seqlens is not None else None
    indices = call.indices.contiguous() if call.indices is not None else None
    plan = _plan_for(call, b, s_q, h_kv)
    nslots = int((plan[:, 3] >= 0).sum())
    # a one-page cache's stride(0) means nothing (torch may report any): the page's own size then
    page_stride = cache.stride(0) * elem if nblocks > 1 else block_size * cache.shape[-1] * elem
    status = lib.pk_mla_decode(q.data_ptr(), b, s_q, h_q, d, h_kv, cache.data_ptr(),
                      2 if model1 else int(call.is_fp8_kvcache), nblocks, block_size, page_stride, cache.stride(1) * elem, cache.stride(2) * elem,
                      chk.ptr(bt), 0 if bt is None else bt.shape[1], chk.ptr(seqlens), chk.ptr(indices),
                      0 if indices is None else indices.shape[-1], float(call.softmax_scale), int(call.causal),
                      plan.data_ptr(), plan.shape[0], nslots, call.out.data_ptr(), call.lse.data_ptr(), num_threads(),
                      0 if engine is None else ENGINES[engine])
    if status == -2:
        raise RuntimeError(f"{op}: native MLA refused engine {engine!r} for MODEL1 pages (FMA engine only)")
    if status:
        raise RuntimeError(f"{op}: native MLA refused engine {engine!r} (no AMX tile permission)")


# -- providers ---------------------------------------------------------------------------------------------

def _decline(call) -> list[str]:
    if LIB.get() is None:
        return [f"native MLA unavailable: {LIB.reason()}"]
    return []


def register(registry) -> None:
    from portable_kernels.ops.attention.decode import FLASH_MLA_WITH_KVCACHE, GET_MLA_METADATA
    from portable_kernels.torch_ops import register_provider_fake
    registry.kernel(GET_MLA_METADATA.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_decline,
                    doc="split plan: each sequence's keys cut so every thread gets about two tasks")(metadata_native)
    register_provider_fake(GET_MLA_METADATA.name, BACKEND, NATIVE, metadata_fake)
    registry.kernel(FLASH_MLA_WITH_KVCACHE.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_decline,
                    dtypes={"q": (torch.bfloat16,)},  # fp16 q (allowed by the contract) is the reference's
                    doc="C++ (deepjit; AMX-BF16 tiles where the CPU has them, else fp32 FMA vectors of the build's "
                        "ISA): 64-key chunks, online softmax, split over the sequence, lse merge"
                    )(decode_native)
