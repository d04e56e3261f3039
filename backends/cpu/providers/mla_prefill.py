"""Native sparse MLA prefill of the cpu backend: flash_mla_sparse_fwd on the MLA decode engines of
mla.cpp (pk_mla_sparse_prefill), not a second attention kernel.

A prefill query token is a sparse decode job over its own index list with the h_q heads as rows; the
key array kv [s_kv, 1, d] is read in place as s_kv pages of one token (any row stride). The engines
also return each row's max logit, honour topk_length (a row reads only its first keys) and apply the
attention sink to out only, as the contract states. Split plan: mla.py's rule, vectorised over the
s_q jobs.
"""

from __future__ import annotations

import functools

import torch

from portable_kernels.core.native.build import num_threads
from portable_kernels.core.tensors import cdiv
from portable_kernels.ops.attention.decode import HEAD_DIM_V, QK_HEAD_DIMS

from .._names import BACKEND, NATIVE
from . import _checks as chk
from .mla import ENGINES, LIB, MIN_SPLIT_KEYS, OPEN_END, TASKS_PER_THREAD, engines

OP = "flash_mla_sparse_fwd"


def sparse_plan(keys: torch.Tensor, threads: int) -> torch.Tensor:
    """mla.mla_split_plan(keys, 1, threads)[0] without a Python loop over jobs: int64 [S, 4] =
    (job, first key, end key, partial slot), each job's key range cut into steps of whole chunks."""
    keys = keys.to(torch.int64)
    jobs = keys.numel()
    tasks = max(jobs, TASKS_PER_THREAD * threads)
    step = max(MIN_SPLIT_KEYS, cdiv(max(int(keys.sum()), 1), tasks))
    step = cdiv(step, 64) * 64
    n = ((keys + step - 1) // step).clamp_min(1)
    job = torch.repeat_interleave(torch.arange(jobs, dtype=torch.int64), n)
    part = torch.arange(job.numel(), dtype=torch.int64) - (torch.cumsum(n, 0) - n)[job]
    split = n[job] > 1
    last = part == n[job] - 1
    end = torch.where(last, torch.full_like(part, OPEN_END), (part + 1) * step)
    slot = torch.where(split, torch.cumsum(split, 0) - 1, torch.full_like(part, -1))
    return torch.stack((job, part * step, end, slot), 1)


@functools.lru_cache(maxsize=64)
def uniform_plan(jobs: int, keys: int, threads: int) -> tuple[torch.Tensor, int]:
    """(sparse_plan of `jobs` jobs of `keys` keys each, its partial slot count): the plan of every call
    without topk_length, kept per shape (the kernel only reads it; a decode step's plan costs more
    than its attention at small sizes)."""
    plan = sparse_plan(torch.full((jobs,), keys, dtype=torch.int64), threads)
    return plan, int((plan[:, 3] >= 0).sum())


def _unit_channels(t) -> bool:
    """t's channels (last dim) are adjacent: rows may lie any distance apart (a view of a wider kv)."""
    return isinstance(t, torch.Tensor) and (t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1)


def _outputs_dense(call) -> tuple[bool, ...]:
    return tuple(isinstance(t, torch.Tensor) and t.is_contiguous() for t in (call.out, call.max_logits, call.lse))


def layout_class(call) -> tuple:
    """What `problems` looks at beyond the dispatch signature (dtypes, devices): kv's channel stride
    and whether the outputs are dense."""
    return (_unit_channels(call.kv),) + _outputs_dense(call)


def problems(call) -> list[str]:
    """Every reason the native kernel cannot run this SparsePrefillInputs (empty: it can)."""
    reasons: list[str] = []
    if LIB.get() is None:
        reasons.append(f"native MLA unavailable: {LIB.reason()}")
    if not _unit_channels(call.kv):
        reasons.append(f"argument 'kv' has strides {tuple(call.kv.stride())}; the native kernel reads rows of "
                       "unit channel stride (pass kv.contiguous())")
    for arg, dense in zip(("out", "max_logits", "lse"), _outputs_dense(call)):
        if not dense:
            reasons.append(f"argument '{arg}' is not a contiguous tensor; the native kernel writes it contiguous")
    return reasons


def sparse_prefill_native(call, engine: str | None = None) -> None:
    """SparsePrefillInputs: writes call.out (bf16 [s_q, h_q, 512]), call.max_logits and call.lse (fp32
    [s_q, h_q]). engine: "fma" or "amx" (one of mla.engines()); None runs the default."""
    lib = LIB.get()
    if lib is None:
        raise RuntimeError(f"{OP}: native MLA unavailable here: {LIB.reason()}")
    if engine is not None and engine not in engines():
        raise ValueError(f"{OP}: engine={engine!r} cannot run here; this CPU and build run {engines()}")
    q = chk.tensor(OP, "q", call.q, (torch.bfloat16,), fix="pass q as bf16 (fp16 runs the reference)")
    if q.dim() != 3 or q.shape[-1] not in QK_HEAD_DIMS:
        chk.fail(OP, "q", f"of shape {tuple(q.shape)}", f"[s_q, h_q, d] with d in {QK_HEAD_DIMS}",
                 "pass q as bf16 [s_q, h_q, 576]")
    if call.d_v != HEAD_DIM_V:
        chk.fail(OP, "d_v", repr(call.d_v), HEAD_DIM_V, "pass d_v=512 (V is kv's first 512 channels)")
    q = q.contiguous()
    s_q, h_q, d = q.shape
    kv = chk.tensor(OP, "kv", call.kv, (torch.bfloat16,), fix=f"pass kv as bf16 [s_kv, 1, {d}]")
    chk.tensor(OP, "kv", kv, (torch.bfloat16,), (kv.shape[0] if kv.dim() else 0, 1, d),
               f"pass kv as bf16 [s_kv, 1, {d}]")
    indices = chk.tensor(OP, "indices", call.indices, (torch.int32,), fix="pass int32 [s_q, 1, topk]")
    topk = indices.shape[-1] if indices.dim() == 3 else 0
    indices = chk.tensor(OP, "indices", indices, (torch.int32,), (s_q, 1, max(topk, 1)),
                         "pass int32 [s_q, 1, topk], topk >= 1").contiguous()
    reasons = problems(call)
    if reasons:  # called directly, past the registry's check: refuse before the C++ reads anything
        chk.fail(OP, "inputs", "; ".join(reasons), "what the native kernel reads", "run flash_mla_sparse_fwd")
    lengths = None if call.topk_length is None else \
        chk.tensor(OP, "topk_length", call.topk_length, (torch.int32,), (s_q,)).contiguous()
    sink = None if call.attn_sink is None else \
        chk.tensor(OP, "attn_sink", call.attn_sink, (torch.float32,), (h_q,)).contiguous()
    for arg, t, dtype, shape in (("out", call.out, torch.bfloat16, (s_q, h_q, 512)),
                                 ("max_logits", call.max_logits, torch.float32, (s_q, h_q)),
                                 ("lse", call.lse, torch.float32, (s_q, h_q))):
        chk.contiguous(OP, arg, chk.tensor(OP, arg, t, (dtype,), shape))
    if s_q == 0 or h_q == 0:
        return
    if lengths is None:
        plan, nslots = uniform_plan(s_q, topk, num_threads())
    else:
        plan = sparse_plan(lengths.clamp(0, topk), num_threads())
        nslots = int((plan[:, 3] >= 0).sum())
    status = lib.pk_mla_sparse_prefill(q.data_ptr(), s_q, h_q, d, kv.data_ptr(), kv.shape[0],
                                       kv.stride(0) * kv.element_size(), indices.data_ptr(), topk, chk.ptr(lengths),
                                       chk.ptr(sink), float(call.sm_scale), plan.data_ptr(), plan.shape[0], nslots,
                                       call.out.data_ptr(), call.max_logits.data_ptr(), call.lse.data_ptr(),
                                       num_threads(), 0 if engine is None else ENGINES[engine])
    if status:
        raise RuntimeError(f"{OP}: native MLA refused engine {engine!r} (no AMX tile permission)")


def register(registry) -> None:
    from portable_kernels.ops.attention.prefill import FLASH_MLA_SPARSE_FWD
    registry.kernel(FLASH_MLA_SPARSE_FWD.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=problems,
                    shape_class=layout_class,
                    dtypes={"q": (torch.bfloat16,)},  # fp16 q (allowed by the contract) is the reference's
                    doc="C++ (deepjit): the MLA decode engines (AMX-BF16 tiles where the CPU has them, else fp32 "
                        "FMA vectors of the build's ISA), one sparse job per query token over its index list"
                    )(sparse_prefill_native)
