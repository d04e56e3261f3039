"""Custom ops of MLA decode: get_mla_metadata and flash_mla_with_kvcache.

Tensor-only form of `MlaMetadata`: `get_mla_metadata` returns `(Tensor[] tensors, Tensor[] num_splits)`
— the backend's scheduling tensors, and num_splits as a list of zero or one tensor (None when the
backend has none). The rest of an MlaMetadata — the backend that computed it and the configuration
— is static: the route fixes the backend when it traces (the op checks it when it runs) and passes
both to `flash_mla_with_kvcache` as `meta_*` arguments, which rebuilds the MlaMetadata inside.
The fake of get_mla_metadata runs the selected provider's registered fake
(`register_provider_fake`; e.g. the cpu native split plan, whose task count depends on the
lengths, gives it a data-dependent size), else the provider itself on fake tensors (the reference
computes its shapes from sizes only). `flash_mla_with_kvcache` writes `out` and `lse` (`Tensor(o!)`,
`Tensor(l!)`); the route allocates them when the caller passes None and returns them.
Schema, route and implementation come from the public signatures (`declare.custom_op`); this
module says how an MlaMetadata crosses, the route's checks and allocations, and the fakes.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.dispatch import plan_for
from ..core.errors import ContractError, format_problem
from ..ops.attention import decode as mla
from ..ops.attention.decode import MlaMetadata, MlaMetadataInputs
from .boundary import check_ran_on, fresh, frozen_new, provider_fake, require, selected
from .declare import Crossing, custom_op


def _metadata_backend(cache_seqlens: torch.Tensor, **_: Any) -> str:
    return selected(mla.GET_MLA_METADATA.name, cache_seqlens.device)[0]


def _metadata_outputs(value: tuple[MlaMetadata, torch.Tensor | None], cache_seqlens: torch.Tensor, backend: str,
                      **_: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    meta, num_splits = value
    check_ran_on(mla.GET_MLA_METADATA.name, "the backend computing it", (backend,), (meta.backend,))
    return fresh(list(meta.tensors), cache_seqlens), fresh([] if num_splits is None else [num_splits], cache_seqlens)


def _metadata_fake(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache, topk, backend):
    inputs = MlaMetadataInputs(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache, topk)
    provider = plan_for(mla.GET_MLA_METADATA, inputs).provider_for(inputs)
    fake = provider_fake(provider)
    try:
        tensors, num_splits = (fake or provider.fn)(inputs)
    except Exception as exc:
        raise ContractError(
            f"get_mla_metadata: provider {provider.backend}/{provider.name} cannot run on fake tensors, so "
            f"torch.compile cannot trace it ({type(exc).__name__}: {exc}). Fix: register the shapes of its "
            f"outputs with portable_kernels.torch_ops.register_provider_fake, or call get_mla_metadata outside "
            f"the compiled function and pass its result in.") from exc
    return list(tensors), ([] if num_splits is None else [num_splits])


def _metadata_result(outputs: tuple, cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int, num_heads_k: int,
                     num_heads_q: int | None, is_fp8_kvcache: bool, topk: int | None,
                     **_: Any) -> tuple[MlaMetadata, torch.Tensor | None]:
    tensors, splits = outputs
    num_splits = splits[0] if len(splits) else None
    meta = frozen_new(MlaMetadata, backend=_metadata_backend(cache_seqlens), batch_size=cache_seqlens.shape[0],
                      num_q_tokens_per_head_k=num_q_tokens_per_head_k, num_heads_k=num_heads_k, num_heads_q=num_heads_q,
                      is_fp8_kvcache=is_fp8_kvcache, topk=topk, tensors=tuple(tensors), num_splits=num_splits)
    return meta, num_splits


custom_op(mla.get_mla_metadata, extra={"backend": ("str", _metadata_backend)},
          returns="(Tensor[] tensors, Tensor[] num_splits)", fake=_metadata_fake, outputs=_metadata_outputs,
          result=_metadata_result, fresh_outputs=False)


#: an MlaMetadata crosses as its tensors and its static fields
_METADATA = Crossing(
    (("Tensor[]", "tile_scheduler_tensors"), ("Tensor?", "meta_num_splits"), ("str", "meta_backend"),
     ("SymInt", "meta_batch_size"), ("int", "meta_num_q_tokens_per_head_k"), ("int", "meta_num_heads_k"),
     ("int?", "meta_num_heads_q"), ("bool", "meta_is_fp8_kvcache"), ("int?", "meta_topk")),
    lambda meta: (list(meta.tensors), meta.num_splits, meta.backend, meta.batch_size, meta.num_q_tokens_per_head_k,
                  meta.num_heads_k, meta.num_heads_q, meta.is_fp8_kvcache, meta.topk),
    lambda tile_scheduler_tensors, meta_num_splits, meta_backend, meta_batch_size, meta_num_q_tokens_per_head_k,
    meta_num_heads_k, meta_num_heads_q, meta_is_fp8_kvcache, meta_topk: MlaMetadata(
        meta_backend, meta_batch_size, meta_num_q_tokens_per_head_k, meta_num_heads_k, meta_num_heads_q,
        meta_is_fp8_kvcache, meta_topk, tuple(tile_scheduler_tensors), meta_num_splits))

#: num_splits is the metadata's own tensor (it crosses with it): only whether it was passed crosses
_NUM_SPLITS = Crossing((("bool", "pass_num_splits"),), lambda num_splits: (num_splits is not None,),
                       lambda pass_num_splits, meta_num_splits: meta_num_splits if pass_num_splits else None,
                       reads=("pass_num_splits", "meta_num_splits"))


def _decode_before(q: Any, tile_scheduler_metadata: Any, out: torch.Tensor | None, lse: torch.Tensor | None,
                   **_: Any) -> dict[str, torch.Tensor]:
    """Check what the route takes apart, and allocate out / lse when the caller passes None."""
    name = mla.FLASH_MLA_WITH_KVCACHE.name
    require(name, "tile_scheduler_metadata", tile_scheduler_metadata, MlaMetadata,
            "the MlaMetadata returned by portable_kernels.get_mla_metadata",
            "call get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv, ...) from portable_kernels")
    require(name, "q", q, torch.Tensor, "a bf16 [b, s_q, h_q, d] tensor", "pass q as bf16 [b, s_q, h_q, 576]")
    if q.dim() != 4:
        raise ContractError(format_problem(name, "q", f"{q.dim()}-D", "a bf16 [b, s_q, h_q, d] tensor",
                                           "pass q as bf16 [b, s_q, h_q, 576] (or 512)"))
    b, s_q, h_q, _ = q.shape
    if out is None:
        out = torch.empty((b, s_q, h_q, mla.HEAD_DIM_V), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((b, h_q, s_q), dtype=mla.LSE_DTYPE, device=q.device)
    return {"out": out, "lse": lse}


# the sparse extensions were appended to the published schema, each defaulting to None
custom_op(mla.flash_mla_with_kvcache, writes=("out", "lse"), types={"out": "Tensor", "lse": "Tensor"},
          crossings={"tile_scheduler_metadata": _METADATA, "num_splits": _NUM_SPLITS},
          tail=("attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "topk_length", "extra_topk_length"),
          before=_decode_before, result=lambda outputs, out, lse, **_: (out, lse))
