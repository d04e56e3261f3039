"""Lightning-indexer cases (DeepSeek-V3.2: 64 heads, head dim 128): fp8_mqa_logits (prefill, causal
key ranges) and fp8_paged_mqa_logits (decode over a paged FP8 cache) against the contract's torch
math on dequantized keys — the reference provider's code, what a user would otherwise run. The
FP4 cases (DeepGEMM's SM100 form: q and keys packed E2M1 with UE8M0 per 32) compare the same way,
the peer dequantizing q and keys each call as a user of the packed tensors would."""

from __future__ import annotations

import torch

import portable_kernels as pk
from portable_kernels.layouts import (dequantize_fp4_rows, dequantize_indexer_cache, dequantize_indexer_cache_fp4,
                                      pack_indexer_cache, quantize_fp4_rows, quantize_indexer_keys)
from portable_kernels.ops.attention.indexer import mqa_logits_reference, paged_mqa_logits_reference

from ..case import FULL_ONLY, TINY, Case, Inputs, seeded

FAMILY = "indexer"
TITLE = "indexer logits vs torch einsum on dequantized keys"
HEADS, D, BLOCK_KV = 64, 128, 64


def _fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    packed, words = quantize_fp4_rows(x)
    return packed.view(torch.int8), words


def _build_prefill(m: int, n: int, fp4: bool = False):
    def build(device: torch.device) -> Inputs:
        q = seeded(m, HEADS, D, seed=60, device=device, dtype=torch.float32)
        keys = seeded(n, D, seed=61, device=device)
        q, kv = (_fp4(q), _fp4(keys)) if fp4 else (q.to(torch.float8_e4m3fn), quantize_indexer_keys(keys))
        w = seeded(m, HEADS, seed=62, device=device, dtype=torch.float32)
        ke = torch.arange(m, dtype=torch.int32, device=device) + (n - m + 1)
        return Inputs(q=q, kv=kv, w=w, ks=torch.zeros_like(ke), ke=ke)
    return build


def _prefill_op(i: Inputs) -> object:
    return pk.fp8_mqa_logits(i.q, i.kv, i.w, i.ks, i.ke)


def _prefill_peer(i: Inputs) -> object:
    if isinstance(i.q, tuple):  # FP4
        return mqa_logits_reference(dequantize_fp4_rows(*i.q), dequantize_fp4_rows(*i.kv), i.w, i.ks, i.ke)
    return mqa_logits_reference(i.q, i.kv[0].float() * i.kv[1][:, None], i.w, i.ks, i.ke)


def _build_paged(b: int, next_n: int, context: int, fp4: bool = False):
    def build(device: torch.device) -> Inputs:
        blocks = b * (context // BLOCK_KV)
        keys = seeded(blocks, BLOCK_KV, D, seed=63, device=device)
        cache = pack_indexer_cache(*(quantize_fp4_rows(keys) if fp4 else quantize_indexer_keys(keys)))
        table = torch.arange(blocks, dtype=torch.int32, device=device).view(b, -1)
        lens = torch.arange(next_n, dtype=torch.int32, device=device).repeat(b, 1) + (context - next_n + 1)
        q = seeded(b, next_n, HEADS, D, seed=64, device=device, dtype=torch.float32)
        q = _fp4(q) if fp4 else q.to(torch.float8_e4m3fn)
        w = seeded(b * next_n, HEADS, seed=65, device=device, dtype=torch.float32)
        meta = pk.get_paged_mqa_logits_metadata(lens, BLOCK_KV, 8)
        return Inputs(q=q, cache=cache, w=w, lens=lens, table=table, meta=meta, context=context)
    return build


def _paged_op(i: Inputs) -> object:
    return pk.fp8_paged_mqa_logits(i.q, i.cache, i.w, i.lens, i.table, i.meta, i.context)


def _paged_peer(i: Inputs) -> object:
    if isinstance(i.q, tuple):  # FP4
        return paged_mqa_logits_reference(dequantize_fp4_rows(*i.q), dequantize_indexer_cache_fp4(i.cache), i.w,
                                          i.lens, i.table, i.context)
    return paged_mqa_logits_reference(i.q, dequantize_indexer_cache(i.cache), i.w, i.lens, i.table, i.context)


def _prefill(m: int, n: int, sizes=frozenset({"quick", "full"}), fp4: bool = False) -> Case:
    tag = " fp4" if fp4 else ""
    return Case(FAMILY, "fp8_mqa_logits", f"m={m} n={n} h={HEADS} d={D}{tag}", _build_prefill(m, n, fp4), _prefill_op,
                _prefill_peer, "fp8_mqa_logits", "einsum on dequantized q and keys" if fp4 else
                "einsum on dequantized keys", sizes=sizes)


def _paged(b: int, next_n: int, context: int, sizes=frozenset({"quick", "full"}), fp4: bool = False) -> Case:
    tag = " fp4" if fp4 else ""
    return Case(FAMILY, "fp8_paged_mqa_logits", f"b={b} next_n={next_n} ctx={context} h={HEADS} d={D}{tag}",
                _build_paged(b, next_n, context, fp4), _paged_op, _paged_peer, "fp8_paged_mqa_logits",
                "dequantized cache, einsum per sequence", sizes=sizes)


CASES = [
    _prefill(128, 2048),
    _prefill(512, 4096, sizes=FULL_ONLY),
    _paged(4, 1, 4096),
    _paged(8, 2, 8192, sizes=FULL_ONLY),
    _prefill(128, 2048, fp4=True),
    _paged(4, 1, 4096, fp4=True),
    _prefill(8, 64, sizes=TINY),
    _paged(2, 1, 128, sizes=TINY),
    _prefill(8, 64, sizes=TINY, fp4=True),
    _paged(2, 1, 128, sizes=TINY, fp4=True),
]
