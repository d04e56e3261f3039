"""MoE routing cases: expand_to_fused and reduce_fused against their torch math.

The peer is the contract's reference (index_select / scatter-add in torch). Target from issue 12:
1.5x that.
"""

from __future__ import annotations

import torch

import portable_kernels as pk
from portable_kernels.ops.moe_routing.expand import expand_to_fused_reference
from portable_kernels.ops.moe_routing.reduce import reduce_fused_reference

from ..case import TINY, Case, Inputs, generator, seeded

FAMILY = "moe_routing"
TITLE = "MoE expand/reduce vs their torch math"
SOURCE = "issue 12"
ON = ("cpu",)  # issue 12 set these targets for the cpu backend
PEER = "the contract's torch math"
ALIGNMENT = 128


def _build(t: int, h: int, k: int, e: int, kind: str):
    def build(device: torch.device) -> Inputs:
        gen = generator(50)
        topk_idx = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)]).to(device)
        mapping = pk.get_fused_mapping(topk_idx, e, 0, ALIGNMENT)
        i = Inputs(mapping=mapping)
        if kind == "expand":
            i.x = seeded(t, h, seed=51, device=device)
        else:
            i.y = seeded(mapping.pos_to_expert.shape[0], h, seed=52, device=device)
            i.w = torch.rand(t, k, generator=gen).to(device)
        return i
    return build


def _expand(t: int, h: int, k: int, e: int, sizes=frozenset({"quick", "full"})) -> Case:
    return Case(FAMILY, "expand_to_fused", f"T={t} H={h} k={k} E={e}", _build(t, h, k, e, "expand"),
                lambda i: pk.expand_to_fused(i.x, i.mapping),
                lambda i: expand_to_fused_reference(i.x, i.mapping.token_topk_to_pos, i.mapping.pos_to_expert),
                "expand_to_fused", PEER, target=1.5, target_source=SOURCE, target_on=ON, sizes=sizes)


def _reduce(t: int, h: int, k: int, e: int, sizes=frozenset({"quick", "full"})) -> Case:
    return Case(FAMILY, "reduce_fused", f"T={t} H={h} k={k} E={e}", _build(t, h, k, e, "reduce"),
                lambda i: pk.reduce_fused(i.y, i.w, i.mapping),
                lambda i: reduce_fused_reference(i.y, i.w, i.mapping.token_topk_to_pos).bfloat16(),
                "reduce_fused", PEER, target=1.5, target_source=SOURCE, target_on=ON, sizes=sizes)


CASES = [
    _expand(4096, 7168, 8, 64),
    _reduce(4096, 7168, 8, 64),
    _expand(32, 256, 2, 8, sizes=TINY),
    _reduce(32, 256, 2, 8, sizes=TINY),
]
