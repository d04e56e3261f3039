"""Prefill attention (FlashMLA names and argument order): sparse MLA prefill and dense varlen attention.

`flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None)
 -> (out, max_logits, lse)`: every query token attends to the kv rows its `indices` list (h_kv = 1;
-1 or >= s_kv = no key; with topk_length[i] only the first ones). V = the first d_v channels of kv.
`flash_attn_varlen_func(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv,
dropout_p=0.0, softmax_scale=None, causal=False, deterministic=False, is_varlen=True) -> (out, lse)`:
packed variable-length sequences, grouped-query heads (h_q a multiple of h_kv), causal masks
bottom-right aligned (query i of a sequence sees keys <= s_k - s_q + i); differentiable in q, k, v
through the reference's backward (varlen_grad.py), lse not.
Both follow the decode's conventions: a query with no key gives out 0 and lse +inf (max_logits
-inf); attn_sink scales out by exp(lse) / (exp(lse) + exp(sink)) and leaves lse alone.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from ...core.checks import check_bool, check_tensor, is_int
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from .varlen_grad import needs_backward, with_reference_backward
from .decode import HEAD_DIM_V, QK_HEAD_DIMS, REFERENCE_CHUNK_ELEMENTS, SINK_DTYPE
from ...core.providers import Inputs
from ...core.tensors import describe

INDEX_DTYPE = torch.int32
PREFILL_DTYPES = (torch.bfloat16, torch.float16)


def _softmax_parts(logits: torch.Tensor, visible: torch.Tensor, sink: torch.Tensor | None):
    """(weights for out, lse, max_logits) of masked logits [..., keys]; no key: weights 0, lse +inf."""
    logits = logits.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(logits, dim=-1)
    max_logits = logits.amax(dim=-1) if logits.shape[-1] else lse.clone()
    lse_out = lse if sink is None else torch.logaddexp(lse, sink)
    weights = torch.exp(logits - lse_out.masked_fill(torch.isneginf(lse_out), math.inf).unsqueeze(-1))
    return weights, lse.masked_fill(torch.isneginf(lse), math.inf), max_logits


def sparse_prefill_reference(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int,
                             attn_sink: torch.Tensor | None = None, topk_length: torch.Tensor | None = None,
                             dtype: torch.dtype = torch.float32):
    """Reference math: (out [s_q, h_q, d_v], max_logits [s_q, h_q], lse [s_q, h_q]) in `dtype`."""
    s_q, h_q, d = q.shape
    s_kv, topk = kv.shape[0], indices.shape[-1]
    idx = indices[:, 0, :].long()
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        valid &= torch.arange(topk, device=q.device)[None, :] < topk_length.long()[:, None]
    safe = torch.where(valid, idx, 0)
    sink = None if attn_sink is None else attn_sink.to(dtype)
    outs, maxes, lses = [], [], []
    chunk = max(1, REFERENCE_CHUNK_ELEMENTS // max(1, topk * d))
    for start in range(0, max(s_q, 1), chunk):
        rows = slice(start, start + chunk)
        keys = torch.where(valid[rows, :, None], kv[safe[rows], 0].to(dtype), 0)               # [c, topk, d]
        logits = torch.einsum("qhd,qkd->qhk", q[rows].to(dtype), keys) * sm_scale
        weights, lse, max_logits = _softmax_parts(logits, valid[rows, None, :], sink)
        outs.append(torch.einsum("qhk,qkv->qhv", weights, keys[..., :d_v]))
        maxes.append(max_logits)
        lses.append(lse)
    return torch.cat(outs), torch.cat(maxes), torch.cat(lses)


def varlen_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_qo: torch.Tensor,
                     cu_seqlens_kv: torch.Tensor, softmax_scale: float, causal: bool,
                     dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference math, sequence by sequence: (out [total_q, h_q, d_v], lse [total_q, h_q]) in `dtype`."""
    total_q, h_q, _ = q.shape
    h_kv = k.shape[1]
    out = torch.zeros(total_q, h_q, v.shape[-1], dtype=dtype, device=q.device)
    lse = torch.full((total_q, h_q), math.inf, dtype=dtype, device=q.device)
    bounds_q, bounds_k = cu_seqlens_qo.tolist(), cu_seqlens_kv.tolist()
    for i in range(len(bounds_q) - 1):
        q0, q1, k0, k1 = bounds_q[i], bounds_q[i + 1], bounds_k[i], bounds_k[i + 1]
        s_q, s_k = q1 - q0, k1 - k0
        if s_q == 0:
            continue
        keys = k[k0:k1].to(dtype).repeat_interleave(h_q // h_kv, dim=1)
        values = v[k0:k1].to(dtype).repeat_interleave(h_q // h_kv, dim=1)
        logits = torch.einsum("qhd,khd->hqk", q[q0:q1].to(dtype), keys) * softmax_scale
        visible = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device)
        if causal:
            visible = visible.tril(diagonal=s_k - s_q)
        weights, seq_lse, _ = _softmax_parts(logits, visible, None)
        out[q0:q1] = torch.einsum("hqk,khv->qhv", weights, values)
        lse[q0:q1] = seq_lse.T
    return out, lse


@attrs.frozen
class SparsePrefillInputs(Inputs):
    """One flash_mla_sparse_fwd call (validated, outputs allocated): q [s_q, h_q, d], kv [s_kv, 1, d],
    indices int32 [s_q, 1, topk], attn_sink None or fp32 [h_q], topk_length None or int32 [s_q];
    out [s_q, h_q, d_v] (q's dtype), max_logits and lse fp32 [s_q, h_q] to write."""

    q: torch.Tensor
    kv: torch.Tensor
    indices: torch.Tensor
    sm_scale: float
    d_v: int
    attn_sink: torch.Tensor | None
    topk_length: torch.Tensor | None
    out: torch.Tensor
    max_logits: torch.Tensor
    lse: torch.Tensor
    device_field = "q"

    def dims(self) -> dict[str, int]:
        s_q, h_q, d = self.q.shape
        return {"s_q": s_q, "h_q": h_q, "d": d, "s_kv": self.kv.shape[0], "topk": self.indices.shape[-1]}


@attrs.frozen
class VarlenInputs(Inputs):
    """One flash_attn_varlen_func call (validated, outputs allocated): q [total_q, h_q, d], k
    [total_kv, h_kv, d], v [total_kv, h_kv, d_v], int32 cu_seqlens [b + 1]; out [total_q, h_q, d_v]
    (q's dtype) and lse fp32 [total_q, h_q] to write."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_qo: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    max_seqlen_qo: int
    max_seqlen_kv: int
    softmax_scale: float
    causal: bool
    out: torch.Tensor
    lse: torch.Tensor
    device_field = "q"

    def dims(self) -> dict[str, int]:
        total_q, h_q, d = self.q.shape
        return {"total_q": total_q, "h_q": h_q, "d": d, "h_kv": self.k.shape[1], "d_v": self.v.shape[-1],
                "b": self.cu_seqlens_qo.shape[0] - 1}


def sparse_prefill_kernel(call: SparsePrefillInputs) -> None:
    """Reference kernel of flash_mla_sparse_fwd (fp32 math, written into out, max_logits, lse)."""
    if call.q.shape[0] == 0:
        return
    out, max_logits, lse = sparse_prefill_reference(call.q, call.kv, call.indices, call.sm_scale, call.d_v,
                                                    call.attn_sink, call.topk_length)
    call.out.copy_(out)
    call.max_logits.copy_(max_logits)
    call.lse.copy_(lse)


def varlen_kernel(call: VarlenInputs) -> None:
    """Reference kernel of flash_attn_varlen_func (fp32 math, written into out and lse)."""
    out, lse = varlen_reference(call.q, call.k, call.v, call.cu_seqlens_qo, call.cu_seqlens_kv, call.softmax_scale,
                                call.causal)
    call.out.copy_(out)
    call.lse.copy_(lse)


FLASH_MLA_SPARSE_FWD = register_contract(OpContract(
    "flash_mla_sparse_fwd", sparse_prefill_reference, Tolerance(dequantized=5e-6), kernel=sparse_prefill_kernel))
FLASH_ATTN_VARLEN = register_contract(OpContract(
    "flash_attn_varlen_func", varlen_reference, Tolerance(dequantized=7e-6), kernel=varlen_kernel))


def _check_scale(op: str, arg: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ContractError(format_problem(op, arg, describe(value), "a finite float", "pass e.g. d ** -0.5"))
    return float(value)


@public_op(FLASH_MLA_SPARSE_FWD)
def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
                         attn_sink: torch.Tensor | None = None,
                         topk_length: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse MLA prefill.

    q: bf16/fp16 [s_q, h_q, d_qk], d_qk 576 or 512; kv: [s_kv, 1, d_qk] of q's dtype;
    indices: int32 [s_q, 1, topk] rows of kv (-1 or >= s_kv: no key); sm_scale: float; d_v: 512
    attn_sink: None or fp32 [h_q]; topk_length: None or int32 [s_q] (only indices[i, :, :topk_length[i]])
    Returns (out [s_q, h_q, d_v] of q's dtype, max_logits fp32 [s_q, h_q], lse fp32 [s_q, h_q]).
    """
    if is_compiling():
        return compiled_call("flash_mla_sparse_fwd", q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    op = FLASH_MLA_SPARSE_FWD.name
    if not isinstance(q, torch.Tensor) or q.dtype not in PREFILL_DTYPES or q.dim() != 3 or q.shape[2] not in QK_HEAD_DIMS:
        raise ContractError(format_problem(op, "q", describe(q), f"bf16/fp16 [s_q, h_q, d] with d in {QK_HEAD_DIMS}",
                                           "pass q as bf16 [s_q, h_q, 576]"))
    s_q, h_q, d = q.shape
    check_tensor(op, "kv", kv, (q.dtype,), (None, 1, d), q.device, f"pass kv as [s_kv, 1, {d}] of q's dtype (h_kv = 1)")
    check_tensor(op, "indices", indices, (INDEX_DTYPE,), (s_q, 1, None), q.device,
                 "pass int32 [s_q, 1, topk] rows of kv, -1 for none")
    if indices.shape[-1] < 1:
        raise ContractError(format_problem(op, "indices", "with topk = 0", "topk >= 1", "pass at least one index"))
    if not is_int(d_v) or d_v != HEAD_DIM_V:
        raise ContractError(format_problem(op, "d_v", repr(d_v), HEAD_DIM_V, "pass d_v=512 (V is kv's first 512)"))
    scale = _check_scale(op, "sm_scale", sm_scale)
    if attn_sink is not None:
        check_tensor(op, "attn_sink", attn_sink, (SINK_DTYPE,), (h_q,), q.device, "pass fp32 [h_q] sink logits")
    if topk_length is not None:
        check_tensor(op, "topk_length", topk_length, (INDEX_DTYPE,), (s_q,), q.device, "pass int32 [s_q] lengths")
        if checks_values(topk_length) and bool(((topk_length < 0) | (topk_length > indices.shape[-1])).any()):
            raise ContractError(format_problem(op, "topk_length", "with values outside [0, topk]",
                                               f"values in [0, {indices.shape[-1]}]", "clamp the lengths"))
    out = torch.empty(s_q, h_q, d_v, dtype=q.dtype, device=q.device)
    max_logits = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    lse = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    run(FLASH_MLA_SPARSE_FWD, SparsePrefillInputs(q, kv, indices, scale, d_v, attn_sink, topk_length, out,
                                                  max_logits, lse))
    return out, max_logits, lse


def _check_cu_seqlens(op: str, arg: str, cu: Any, b: int | None, total: int, max_seqlen: Any,
                      device: torch.device) -> None:
    check_tensor(op, arg, cu, (INDEX_DTYPE,), (None if b is None else b + 1,), device,
                 f"pass int32 [b + 1] cumulative lengths starting at 0 ({arg})")
    if cu.shape[0] < 1:
        raise ContractError(format_problem(op, arg, "empty", "[b + 1] entries", "start the cumulative sums with 0"))
    if not is_int(max_seqlen) or max_seqlen < 0:
        raise ContractError(format_problem(op, f"max_seqlen for {arg}", repr(max_seqlen), "an int >= 0",
                                           "pass the longest sequence's length"))
    if checks_values(cu):
        lengths = cu[1:] - cu[:-1]
        if int(cu[0]) != 0 or bool((lengths < 0).any()) or int(cu[-1]) > total or \
                (lengths.numel() and int(lengths.max()) > max_seqlen):
            raise ContractError(format_problem(op, arg, str(cu.tolist()[:8]),
                                               f"non-decreasing from 0, ending <= {total}, steps <= max_seqlen "
                                               f"{max_seqlen}", "build it as pad(cumsum(lengths), (1, 0))"))


@public_op(FLASH_ATTN_VARLEN)
def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_qo: torch.Tensor,
                           cu_seqlens_kv: torch.Tensor, max_seqlen_qo: int, max_seqlen_kv: int, dropout_p: float = 0.0,
                           softmax_scale: float | None = None, causal: bool = False, deterministic: bool = False,
                           is_varlen: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention over packed variable-length sequences (differentiable in q, k and v: the
    provider runs the forward, the reference math differentiated by autograd the backward).

    q: bf16/fp16 [total_q, h_q, d]; k: [total_kv, h_kv, d], v: [total_kv, h_kv, d_v] of q's dtype,
    h_q a multiple of h_kv; cu_seqlens_qo / cu_seqlens_kv: int32 [b + 1]; max_seqlen_*: host ints
    dropout_p: 0.0 only; deterministic: False only (as FlashMLA); is_varlen: accepted, no effect
    softmax_scale: default d ** -0.5; causal: bottom-right aligned mask
    Returns (out [total_q, h_q, d_v] of q's dtype, lse fp32 [total_q, h_q]).
    """
    if is_compiling():
        return compiled_call("flash_attn_varlen_func", q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo,
                             max_seqlen_kv, dropout_p, softmax_scale, causal, deterministic, is_varlen)
    op = FLASH_ATTN_VARLEN.name
    if not isinstance(q, torch.Tensor) or q.dtype not in PREFILL_DTYPES or q.dim() != 3:
        raise ContractError(format_problem(op, "q", describe(q), "bf16/fp16 [total_q, h_q, d]", "pass packed q"))
    total_q, h_q, d = q.shape
    check_tensor(op, "k", k, (q.dtype,), (None, None, d), q.device, f"pass k as [total_kv, h_kv, {d}] of q's dtype")
    total_kv, h_kv = k.shape[:2]
    check_tensor(op, "v", v, (q.dtype,), (total_kv, h_kv, None), q.device, "pass v as [total_kv, h_kv, d_v]")
    if h_kv < 1 or h_q % h_kv:
        raise ContractError(format_problem(op, "k", f"with {h_kv} heads", f"a divisor of h_q = {h_q}",
                                           "pass grouped-query heads (h_q a multiple of h_kv)"))
    if dropout_p != 0.0:
        raise ContractError(format_problem(op, "dropout_p", repr(dropout_p), "0.0", "attention dropout is not provided"))
    for arg, value in (("causal", causal), ("deterministic", deterministic), ("is_varlen", is_varlen)):
        check_bool(op, arg, value)
    if deterministic:
        raise ContractError(format_problem(op, "deterministic", "True", "False (as FlashMLA, which asserts it)",
                                           "drop the flag"))
    _check_cu_seqlens(op, "cu_seqlens_qo", cu_seqlens_qo, None, total_q, max_seqlen_qo, q.device)
    _check_cu_seqlens(op, "cu_seqlens_kv", cu_seqlens_kv, cu_seqlens_qo.shape[0] - 1, total_kv, max_seqlen_kv,
                      q.device)
    scale = d ** -0.5 if softmax_scale is None else _check_scale(op, "softmax_scale", softmax_scale)

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.zeros(total_q, h_q, v.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.full((total_q, h_q), math.inf, dtype=torch.float32, device=q.device)
        run(FLASH_ATTN_VARLEN, VarlenInputs(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv,
                                            scale, causal, out, lse))
        return out, lse

    if needs_backward(q, k, v):  # the provider's forward, the reference's backward (varlen_grad.py)
        return with_reference_backward(forward, q, k, v, cu_seqlens_qo, cu_seqlens_kv, scale, causal)
    return forward(q, k, v)
