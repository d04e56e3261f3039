"""nvidia providers of the lightning-indexer logits (fp8_mqa_logits, fp8_paged_mqa_logits): the
Triton kernels of ../kernels/mqa_logits.py and paged_mqa_logits.py. Shapes they do not take (head
dim other than 32, 64, 128, 256, more than 128 heads, next_n above 8) are declined with the
reason, and the layout-reference oracle serves them."""

from __future__ import annotations

import torch

from portable_kernels.core.registry import Registry
from portable_kernels.ops.attention.indexer import (MQA_LOGITS, PAGED_MQA_LOGITS, MqaLogitsInputs,
                                                    PagedMqaLogitsInputs)

from ..kernels._indexer_limits import HEAD_DIMS, MAX_HEADS, MAX_NEXT_N
from ._common import BACKEND, TRITON, TRITON_PRIORITY, kernel, triton_devices, triton_reasons

PREFILL = "mqa_logits"
PAGED = "paged_mqa_logits"
DTYPES = {"q": (torch.float8_e4m3fn,), "weights": (torch.float32, torch.bfloat16),
          "logits": (torch.float32, torch.bfloat16)}


def _shape_reasons(heads: int, d: int) -> list[str]:
    out = []
    if d not in HEAD_DIMS:
        out.append(f"head dim {d} is not one of {HEAD_DIMS} (the kernels' dot K is a power of two)")
    if heads > MAX_HEADS:
        out.append(f"{heads} heads > {MAX_HEADS} (the dot's M tile holds the padded heads)")
    return out


def _logits_reasons(logits: torch.Tensor) -> list[str]:
    return [] if logits.stride(1) == 1 or logits.shape[1] <= 1 else ["logits columns must be contiguous"]


def _prefill_reasons(call: MqaLogitsInputs) -> list[str]:
    _, heads, d = call.q.shape
    return triton_reasons(call) + _shape_reasons(heads, d) + _logits_reasons(call.logits)


def _paged_reasons(call: PagedMqaLogitsInputs) -> list[str]:
    _, next_n, heads, d = call.q.shape
    out = triton_reasons(call) + _shape_reasons(heads, d) + _logits_reasons(call.logits)
    if next_n > MAX_NEXT_N:
        out.append(f"next_n = {next_n} > {MAX_NEXT_N} (the kernel unrolls a sequence's rows)")
    return out


def _shape_class(call: MqaLogitsInputs | PagedMqaLogitsInputs):
    """What the checks look at: (next_n,) heads, head dim, whether the logits columns are contiguous."""
    return tuple(call.q.shape[1:]), not _logits_reasons(call.logits)


def _mqa_logits(call: MqaLogitsInputs) -> None:
    kernel(PREFILL).mqa_logits(call.q, call.kv, call.kv_scales, call.weights, call.k_start, call.k_end,
                               call.compressed, call.logits)


def _paged_mqa_logits(call: PagedMqaLogitsInputs) -> None:
    kernel(PAGED).paged_mqa_logits(call.q, call.kv_cache, call.weights, call.context_lens, call.block_table,
                                   call.logits)


def register(registry: Registry) -> None:
    registry.kernel(MQA_LOGITS.name, BACKEND, TRITON, priority=TRITON_PRIORITY, dtypes=DTYPES,
                    devices=triton_devices(), check=_prefill_reasons, shape_class=_shape_class,
                    doc="Triton: (query rows x key tile) programs, rows x heads as one fp8 dot's M; "
                        "untested on a GPU")(_mqa_logits)
    registry.kernel(PAGED_MQA_LOGITS.name, BACKEND, TRITON, priority=TRITON_PRIORITY, dtypes=DTYPES,
                    devices=triton_devices(), check=_paged_reasons, shape_class=_shape_class,
                    doc="Triton: (sequence x key tile) programs over the paged FP8 cache, tokens gathered "
                        "through block_table; untested on a GPU")(_paged_mqa_logits)
