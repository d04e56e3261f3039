"""MLA cases: flash_mla_with_kvcache against gathering the paged cache and calling SDPA, and
DeepSeek-V3.2's sparse prefill (flash_mla_sparse_fwd) against gathering each query token's keys.

The decode peer gathers (and, for the FP8 cache, dequantizes) each sequence's keys and runs
scaled_dot_product_attention with the query heads as rows over the one latent KV head. Target
from issue 12: 1.5x that; issue 23 asks 4x at b=4 s_k=4096 h_q=128 on every CPU (AVX2 included).
The sparse prefill peer gathers the topk kv rows of every query token (32 tokens at a time, to bound
the gathered copy) and runs SDPA with the token as the batch and its heads as rows; no target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import portable_kernels as pk
from portable_kernels.layouts import dequantize_fp8_kv_cache, pack_fp8_kv_cache

from ..case import FULL_ONLY, TINY, Case, Inputs, generator, seeded

FAMILY = "mla"
TITLE = "MLA decode vs gather + SDPA"
SOURCE = "issue 12"
ON = ("cpu",)  # issue 12 set these targets for the cpu backend
BLOCK = 64
D_QK, D_V = 576, 512


def _build(b: int, s_k: int, fp8: bool, topk: int | None, h_q: int):
    def build(device: torch.device) -> Inputs:
        blocks = b * (s_k // BLOCK)
        latent = seeded(blocks, BLOCK, 1, D_V, seed=30, device=device)
        rope = seeded(blocks, BLOCK, 1, D_QK - D_V, seed=31, device=device)
        cache = pack_fp8_kv_cache(latent, rope) if fp8 else torch.cat((latent, rope), -1)
        table = torch.arange(blocks, dtype=torch.int32, device=device).view(b, -1)
        seqlens = torch.full((b,), s_k, dtype=torch.int32, device=device)
        q = seeded(b, 1, h_q, D_QK, seed=32, device=device, scale=0.1)
        indices = None
        if topk is not None:
            gen = generator(33)
            picks = torch.stack([torch.randperm(s_k, generator=gen)[:topk] for _ in range(b)]).to(device)
            slots = table.long().repeat_interleave(BLOCK, 1).gather(1, picks) * BLOCK + picks % BLOCK
            indices = slots.to(torch.int32)[:, None, :]
        meta, splits = pk.get_mla_metadata(seqlens, h_q, 1, h_q if topk is not None else None, fp8, topk)
        return Inputs(q=q, cache=cache, table=table, seqlens=seqlens, indices=indices, meta=meta, splits=splits,
                      fp8=fp8, scale=D_QK ** -0.5, b=b)
    return build


def _op(i: Inputs) -> object:
    return pk.flash_mla_with_kvcache(i.q, i.cache, i.table, i.seqlens, D_V, i.meta, i.splits, i.scale, False, i.fp8,
                                     i.indices)


def _peer(i: Inputs) -> object:
    outs = []
    for s in range(i.b):
        if i.indices is not None:
            tokens = i.cache.view(-1, *i.cache.shape[2:])[i.indices[s, 0].long()]
        else:
            tokens = i.cache[i.table[s].long()].flatten(0, 1)
        if i.fp8:
            tokens = dequantize_fp8_kv_cache(tokens, torch.bfloat16)
        kv = tokens[:, 0][None, None]
        outs.append(F.scaled_dot_product_attention(i.q[s].transpose(0, 1)[None], kv, kv[..., :D_V], scale=i.scale))
    return outs


def _case(b: int, s_k: int, fp8: bool, topk: int | None = None, h_q: int = 128,
          sizes=frozenset({"quick", "full"}), target: float = 1.5, source: str = SOURCE) -> Case:
    kind = ("fp8" if fp8 else "bf16") + (" sparse" if topk else "")
    shape = f"b={b} s_k={s_k} h_q={h_q}" + (f" topk={topk}" if topk else "")
    return Case(FAMILY, f"flash_mla_with_kvcache {kind}", shape, _build(b, s_k, fp8, topk, h_q), _op, _peer,
                "flash_mla_with_kvcache", "gather" + (" + dequantize" if fp8 else "") + " + SDPA per sequence",
                target=target, target_source=source, target_on=ON, sizes=sizes)


CASES = [
    _case(1, 32768, False),
    _case(1, 32768, True),
    _case(64, 1024, False, sizes=FULL_ONLY),
    _case(8, 4096, True),
    _case(4, 4096, False, target=4.0, source="issue 23"),
    _case(4, 4096, True, target=4.0, source="issue 23"),
    _case(8, 8192, True, topk=2048),
    _case(2, 256, False, h_q=16, sizes=TINY),
    _case(2, 256, True, topk=64, h_q=16, sizes=TINY),
]


# -- sparse prefill (flash_mla_sparse_fwd) -------------------------------------------------------------------

#: query tokens the prefill peer gathers keys for at a time (s_q x topk x 576 bf16 at once is 600 MB at
#: s_q=256 topk=2048)
PEER_TOKENS = 32


def _build_prefill(s_q: int, h_q: int, s_kv: int, topk: int):
    def build(device: torch.device) -> Inputs:
        q = seeded(s_q, h_q, D_QK, seed=34, device=device, scale=0.1)
        kv = seeded(s_kv, 1, D_QK, seed=35, device=device)
        gen = generator(36)
        indices = torch.stack([torch.randperm(s_kv, generator=gen)[:topk] for _ in range(s_q)])
        return Inputs(q=q, kv=kv, indices=indices.to(torch.int32)[:, None, :].to(device), scale=D_QK ** -0.5)
    return build


def _prefill_op(i: Inputs) -> object:
    return pk.flash_mla_sparse_fwd(i.q, i.kv, i.indices, i.scale, D_V)


def _prefill_peer(i: Inputs) -> object:
    outs = []
    for s in range(0, i.q.shape[0], PEER_TOKENS):
        keys = i.kv[i.indices[s:s + PEER_TOKENS, 0].long(), 0][:, None]        # [tokens, 1, topk, d]
        outs.append(F.scaled_dot_product_attention(i.q[s:s + PEER_TOKENS, None], keys, keys[..., :D_V], scale=i.scale))
    return outs


def _prefill_case(s_q: int, h_q: int, s_kv: int, topk: int, sizes=frozenset({"quick", "full"})) -> Case:
    return Case(FAMILY, "flash_mla_sparse_fwd bf16", f"s_q={s_q} h_q={h_q} s_kv={s_kv} topk={topk}",
                _build_prefill(s_q, h_q, s_kv, topk), _prefill_op, _prefill_peer, "flash_mla_sparse_fwd",
                f"gather {PEER_TOKENS} tokens' keys + SDPA", sizes=sizes)


CASES += [
    _prefill_case(256, 64, 4096, 2048),
    _prefill_case(256, 16, 4096, 512),
    _prefill_case(1024, 128, 8192, 2048, sizes=FULL_ONLY),
    _prefill_case(8, 16, 256, 64, sizes=TINY),
]
