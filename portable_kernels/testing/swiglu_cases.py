"""Conformance cases for swiglu_forward: fp32 values against an fp64 SwiGLU, padding rows exactly
zero (the output is poisoned first), clamp counts equal to a count over the valid rows."""

from __future__ import annotations

import functools

import torch

from ..ops.swiglu import swiglu_reference, swiglu_rows
from ..ops.swiglu import SWIGLU_FORWARD, swiglu_forward
from .checks import assert_close
from .core import Case, CaseFailure, conformance_cases
from .fp4_cases import _swiglu_inputs

QUICK = [(1, 64, False, False, None), (37, 96, True, True, None), (64, 128, True, True, 0.5),
         (20, 40, False, True, 2.0)]
FULL = QUICK + [(512, 1024, True, True, 10.0), (300, 2048, False, False, 0.5)]


def _case(m: int, inter: int, weighted: bool, padded: bool, clamp, seed: int, device: torch.device) -> float:
    x, mapping = _swiglu_inputs(m, inter, weighted, padded, seed, device)
    counts = None if clamp is None else torch.full((3,), 5, dtype=torch.int64, device=device)
    out = swiglu_forward(x, mapping["pos_to_token_topk"], mapping["topk_weights"], clamp, counts,
                         pos_to_expert=mapping["pos_to_expert"])
    if out.dtype != torch.float32 or tuple(out.shape) != (m, inter):
        raise CaseFailure(f"output is {out.dtype} {tuple(out.shape)}; expected float32 [{m}, {inter}]")
    cpu_map = {key: (None if v is None else v.cpu()) for key, v in mapping.items()}
    valid, weight = swiglu_rows(m, cpu_map["pos_to_token_topk"], cpu_map["topk_weights"], cpu_map["pos_to_expert"],
                                torch.device("cpu"))
    got = out.cpu()
    if bool((got[~valid] != 0).any()):
        raise CaseFailure("padding rows are not zero")
    if clamp is not None:
        gate, up = x.cpu().float()[valid].chunk(2, dim=-1)
        want = torch.stack([(gate > clamp).sum(), (up > clamp).sum(), (up < -clamp).sum()]) + 5
        if not torch.equal(counts.cpu(), want):
            raise CaseFailure(f"clamped_count {counts.tolist()}; expected {want.tolist()} (5 + this call's counts)")
    exact = swiglu_reference(x.cpu().double(), None if weight is None else weight.double(), clamp)
    return assert_close(got[valid], exact[valid], SWIGLU_FORWARD.tolerance.dequantized, "swiglu vs fp64")


@conformance_cases("swiglu_forward")
def swiglu_forward_cases(quick: bool) -> list[Case]:
    cases = []
    for i, (m, inter, weighted, padded, clamp) in enumerate(QUICK if quick else FULL):
        seed = 7200 + 10 * i
        label = f"m={m} I={inter} weighted={weighted} padded={padded} clamp={clamp}"
        cases.append(Case("swiglu_forward", label, seed,
                          functools.partial(_case, m, inter, weighted, padded, clamp, seed)))
    return cases
