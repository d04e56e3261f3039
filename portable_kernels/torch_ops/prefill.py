"""Custom ops of prefill attention: sparse MLA prefill (flash_mla_sparse_fwd) and varlen dense
attention (flash_attn_varlen_func). Both return fresh tensors whose shapes follow from the sizes;
schema, route and implementation come from the public signatures (`declare.custom_op`)."""

from __future__ import annotations

import torch

from ..ops.attention import prefill
from .declare import custom_op


def _sparse_fake(q: torch.Tensor, d_v: int, **_: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s_q, h_q = q.shape[:2]
    return (q.new_empty((s_q, h_q, d_v)), q.new_empty((s_q, h_q), dtype=torch.float32),
            q.new_empty((s_q, h_q), dtype=torch.float32))


def _varlen_fake(q: torch.Tensor, v: torch.Tensor, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    total_q, h_q = q.shape[:2]
    return q.new_empty((total_q, h_q, v.shape[-1])), q.new_empty((total_q, h_q), dtype=torch.float32)


custom_op(prefill.flash_mla_sparse_fwd, returns="(Tensor out, Tensor max_logits, Tensor lse)", fake=_sparse_fake)
custom_op(prefill.flash_attn_varlen_func, returns="(Tensor out, Tensor lse)", fake=_varlen_fake)
