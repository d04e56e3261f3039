"""nvidia providers of MLA decode: get_mla_metadata (the Triton decode's split-KV schedule) and
flash_mla_with_kvcache (Triton split-KV decode + combine; FlashMLA delegation)."""

from __future__ import annotations

from typing import Any

import torch

from portable_kernels.ops.attention.decode import (FLASH_MLA_WITH_KVCACHE, GET_MLA_METADATA, MlaDecodeInputs, MlaMetadataInputs,
                                  reject_bad_cache_references)
from portable_kernels.core.registry import Registry

from ..vendor import flash_mla
from ._common import BACKEND, LIBRARY_PRIORITY, TRITON, TRITON_PRIORITY, kernel, triton_devices, triton_reasons

SCHEDULE = "mla_metadata"


def _metadata(call: MlaMetadataInputs) -> tuple[tuple[Any, ...], Any]:
    meta, num_splits = kernel(SCHEDULE).get_mla_metadata(call.cache_seqlens, call.num_q_tokens_per_head_k,
                                                         call.num_heads_k, call.topk)
    return (meta,), num_splits


def _schedule(call: MlaDecodeInputs) -> tuple[Any, Any]:
    """The metadata's schedule when it is this kernel's ([P, 8] int32 and num_splits [b + 1]);
    otherwise (metadata computed by another provider of this backend) one computed here."""
    meta = call.tile_scheduler_metadata
    tensors, num_splits = meta.tensors, meta.num_splits
    fields = kernel(SCHEDULE).META_FIELDS
    if len(tensors) == 1 and tensors[0].dim() == 2 and tensors[0].shape[1] == fields and num_splits is not None:
        return tensors[0], num_splits
    b, s_q, h_q, _ = call.q.shape
    h_kv = call.k_cache.shape[2]
    topk = None if call.indices is None else call.indices.shape[-1]
    seqlens = call.cache_seqlens if call.cache_seqlens is not None else torch.zeros(b, dtype=torch.int32,
                                                                                     device=call.q.device)
    return kernel(SCHEDULE).get_mla_metadata(seqlens, s_q * h_q // h_kv, h_kv, topk)


def _decode(call: MlaDecodeInputs) -> None:
    reject_bad_cache_references(call)  # before the cache is read (the kernel also clamps, never reads outside)
    meta, num_splits = _schedule(call)
    kernel("mla_decode").flash_mla_with_kvcache(call.q, call.k_cache, call.block_table, call.cache_seqlens,
                                                call.softmax_scale, call.causal, call.is_fp8_kvcache, call.indices,
                                                meta, num_splits, call.out, call.lse)


def _triton_decode_reasons(call: MlaDecodeInputs) -> list[str]:
    out = triton_reasons(call)
    if call.k_cache_format is not None and call.k_cache_format.paged:
        out.append(f"the Triton decode reads 656-byte rows, not {call.k_cache_format.name} (FlashMLA's MODEL1 "
                   "pages: the flash_mla delegation or the layout-reference oracle)")
    return out


def _flash_mla_reasons(call: MlaDecodeInputs) -> list[str]:
    missing = flash_mla.unavailable_reason()
    return [missing] if missing else flash_mla.reasons(call.k_cache, call.k_cache.shape[2])


def _flash_mla(call: MlaDecodeInputs) -> None:
    reject_bad_cache_references(call)
    flash_mla.decode_call(call.q, call.k_cache, call.block_table, call.cache_seqlens, call.head_dim_v,
                          call.softmax_scale, call.causal, call.is_fp8_kvcache, call.indices).run(call.out, call.lse)


def register(registry: Registry) -> None:
    registry.kernel(GET_MLA_METADATA.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                    check=triton_reasons, doc="split-KV schedule on the device (torch ops, no host sync)")(_metadata)
    registry.kernel(FLASH_MLA_WITH_KVCACHE.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                    dtypes={"q": (torch.bfloat16, torch.float16)},
                    check=_triton_decode_reasons,
                    doc="Triton split-KV decode + combine; bf16/fp16/FP8 (656-byte) caches, sparse")(_decode)
    registry.kernel(FLASH_MLA_WITH_KVCACHE.name, BACKEND, "flash_mla", priority=LIBRARY_PRIORITY, devices=("cuda",),
                    dtypes={"q": (torch.bfloat16,)},
                    check=_flash_mla_reasons, shape_class=lambda call: tuple(call.k_cache.shape[1:3]),
                    doc="delegates to flash_mla when importable (its own schedule); untested on a GPU")(_flash_mla)
