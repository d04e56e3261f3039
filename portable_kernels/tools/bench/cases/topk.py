"""Top-k cases: the public topk (and the provider it selects, called directly) against torch.topk.

Target from issue 12: at least torch.topk's speed (DeepSelect claims 2-20x on GPUs).
"""

from __future__ import annotations

import torch

import portable_kernels as pk
from portable_kernels.core.dispatch import provider_for
from portable_kernels.ops.topk import TOPK, TopkInputs

from ..case import FULL_ONLY, TINY, Case, Inputs, seeded

FAMILY = "topk"
TITLE = "top-k vs torch.topk"
SOURCE = "issue 12"
ON = ("cpu",)  # issue 12 set these targets for the cpu backend


def _build(b: int, n: int, k: int, direct: bool):
    def build(device: torch.device) -> Inputs:
        i = Inputs(x=seeded(b, n, seed=20, device=device, dtype=torch.float32), k=k)
        if direct:
            # what the public op binds for topk(x, k); the provider is the one its plan selects
            i.call = TopkInputs(i.x, k, None, False, False, torch.int64, 2**31 - 1, float("-inf"), True)
            provider = provider_for(TOPK, i.call)
            i.fn, i.provider = provider.fn, provider.name
        return i
    return build


def _case(b: int, n: int, k: int, direct: bool = False, sizes=frozenset({"quick", "full"})) -> Case:
    op = (lambda i: i.fn(i.call)) if direct else (lambda i: pk.topk(i.x, i.k))
    return Case(FAMILY, "topk provider" if direct else "topk", f"{b}x{n} k={k}", _build(b, n, k, direct), op,
                lambda i: torch.topk(i.x, i.k), "the selected provider, called directly" if direct else "topk",
                "torch.topk", target=1.0, target_source=SOURCE, target_on=ON, sizes=sizes)


CASES = [
    _case(1, 1024, 8, direct=True),
    _case(1, 1024, 8),
    _case(64, 32768, 2048, sizes=FULL_ONLY),
    _case(1, 131072, 2048),
    _case(4, 512, 8, direct=True, sizes=TINY),
    _case(4, 512, 8, sizes=TINY),
]
