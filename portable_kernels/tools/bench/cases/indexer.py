"""Lightning-indexer cases (DeepSeek-V3.2: 64 heads, head dim 128): fp8_mqa_logits (prefill, causal
key ranges) and fp8_paged_mqa_logits (decode over a paged FP8 cache) against the contract's torch
math on dequantized keys — the reference provider's code, what a user would otherwise run."""

from __future__ import annotations

import torch

import portable_kernels as pk
from portable_kernels.layouts import dequantize_indexer_cache, pack_indexer_cache, quantize_indexer_keys
from portable_kernels.ops.attention.indexer import mqa_logits_reference, paged_mqa_logits_reference

from ..case import FULL_ONLY, TINY, Case, Inputs, seeded

FAMILY = "indexer"
TITLE = "indexer logits vs torch einsum on dequantized keys"
HEADS, D, BLOCK_KV = 64, 128, 64


def _build_prefill(m: int, n: int):
    def build(device: torch.device) -> Inputs:
        q = seeded(m, HEADS, D, seed=60, device=device, dtype=torch.float32).to(torch.float8_e4m3fn)
        kv = quantize_indexer_keys(seeded(n, D, seed=61, device=device))
        w = seeded(m, HEADS, seed=62, device=device, dtype=torch.float32)
        ke = torch.arange(m, dtype=torch.int32, device=device) + (n - m + 1)
        return Inputs(q=q, kv=kv, w=w, ks=torch.zeros_like(ke), ke=ke)
    return build


def _prefill_op(i: Inputs) -> object:
    return pk.fp8_mqa_logits(i.q, i.kv, i.w, i.ks, i.ke)


def _prefill_peer(i: Inputs) -> object:
    return mqa_logits_reference(i.q, i.kv[0].float() * i.kv[1][:, None], i.w, i.ks, i.ke)


def _build_paged(b: int, next_n: int, context: int):
    def build(device: torch.device) -> Inputs:
        blocks = b * (context // BLOCK_KV)
        keys = seeded(blocks, BLOCK_KV, D, seed=63, device=device)
        cache = pack_indexer_cache(*quantize_indexer_keys(keys))
        table = torch.arange(blocks, dtype=torch.int32, device=device).view(b, -1)
        lens = torch.arange(next_n, dtype=torch.int32, device=device).repeat(b, 1) + (context - next_n + 1)
        q = seeded(b, next_n, HEADS, D, seed=64, device=device, dtype=torch.float32).to(torch.float8_e4m3fn)
        w = seeded(b * next_n, HEADS, seed=65, device=device, dtype=torch.float32)
        meta = pk.get_paged_mqa_logits_metadata(lens, BLOCK_KV, 8)
        return Inputs(q=q, cache=cache, w=w, lens=lens, table=table, meta=meta, context=context)
    return build


def _paged_op(i: Inputs) -> object:
    return pk.fp8_paged_mqa_logits(i.q, i.cache, i.w, i.lens, i.table, i.meta, i.context)


def _paged_peer(i: Inputs) -> object:
    return paged_mqa_logits_reference(i.q, dequantize_indexer_cache(i.cache), i.w, i.lens, i.table, i.context)


def _prefill(m: int, n: int, sizes=frozenset({"quick", "full"})) -> Case:
    return Case(FAMILY, "fp8_mqa_logits", f"m={m} n={n} h={HEADS} d={D}", _build_prefill(m, n), _prefill_op,
                _prefill_peer, "fp8_mqa_logits", "einsum on dequantized keys", sizes=sizes)


def _paged(b: int, next_n: int, context: int, sizes=frozenset({"quick", "full"})) -> Case:
    return Case(FAMILY, "fp8_paged_mqa_logits", f"b={b} next_n={next_n} ctx={context} h={HEADS} d={D}",
                _build_paged(b, next_n, context), _paged_op, _paged_peer, "fp8_paged_mqa_logits",
                "dequantized cache, einsum per sequence", sizes=sizes)


CASES = [
    _prefill(128, 2048),
    _prefill(512, 4096, sizes=FULL_ONLY),
    _paged(4, 1, 4096),
    _paged(8, 2, 8192, sizes=FULL_ONLY),
    _prefill(8, 64, sizes=TINY),
    _paged(2, 1, 128, sizes=TINY),
]
