"""top2_sum_gate (DeepSeek-V3 grouped top-k gate, TileKernels' name) in Triton.

A program scores BLOCK_T tokens x all E experts: sigmoid, sqrt(softplus) or softmax (over the
token's experts) of the logits; experts are ranked by the scores plus the bias (softmax: by the
logits plus the bias, as TileKernels does); each group's score is the sum of its two best; the
num_topk_groups best groups are kept and the num_topk best experts among them chosen, best first.
Every ranking is an iterated arg-max that takes the smaller index among equal values (the
contract's stable order). Weights are the unbiased scores, normalized by their sum + 1e-20 when
asked, times routed_scaling_factor; masked tokens get index -1 and weight 0. Tokens with
fix_routing_mask keep the experts of fixed_topk_idx (weights from this call's scores).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import serialized

OP = "top2_sum_gate"
SCORING = {"sigmoid": 0, "sqrtsoftplus": 1, "softmax": 2}
#: tokens per program
BLOCK_T = 8
#: torch's softplus threshold: above it softplus(x) = x
SOFTPLUS_THRESHOLD = 20.0


@triton.jit
def _log1p(u):
    """log(1 + u) to a few ulps for u >= 0 (Goldberg's trick: the rounding of 1 + u cancels)."""
    w = 1.0 + u
    return tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))


@triton.jit
def _first_max(values, ids, sentinel):
    """(max along axis 1, the smallest id holding it) of a [BLOCK_T, N] tile."""
    best = tl.max(values, axis=1)
    at = tl.min(tl.where(values == best[:, None], ids[None, :], sentinel), axis=1)
    return best, at


@triton.jit
def moe_gate_kernel(logits_ptr, bias_ptr, mask_ptr, fix_ptr, fixed_ptr, idx_ptr, w_ptr, T, E, PER, factor, stride_l,
                    stride_f, stride_i, stride_w, TOPK: tl.constexpr, TOPK_GROUPS: tl.constexpr, GROUPS: tl.constexpr,
                    HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, HAS_FIXED: tl.constexpr, SCORING: tl.constexpr,
                    NORMALIZE: tl.constexpr,
                    E_POW2: tl.constexpr, G_POW2: tl.constexpr, K_POW2: tl.constexpr, BLOCK_T: tl.constexpr,
                    THRESHOLD: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tokens < T
    experts = tl.arange(0, E_POW2)
    emask = experts < E
    x = tl.load(logits_ptr + tokens[:, None].to(tl.int64) * stride_l + experts[None, :],
                mask=tmask[:, None] & emask[None, :], other=0.0)
    if SCORING == 0:
        scores = tl.math.div_rn(tl.full(x.shape, 1.0, tl.float32), 1.0 + tl.exp(-x))
        biased = scores
    elif SCORING == 1:
        soft = tl.where(x > THRESHOLD, x, _log1p(tl.exp(x)))
        scores = tl.sqrt(soft)
        biased = scores
    else:
        shifted = tl.where(emask[None, :], x - tl.max(tl.where(emask[None, :], x, float("-inf")), axis=1)[:, None],
                           float("-inf"))
        ex = tl.exp(shifted)
        scores = tl.math.div_rn(ex, tl.sum(ex, axis=1)[:, None])
        biased = x  # softmax is monotonic: experts are ranked by the logits (TileKernels)
    if HAS_BIAS:
        biased = biased + tl.load(bias_ptr + experts, mask=emask, other=0.0)[None, :]
    biased = tl.where(emask[None, :], biased, float("-inf"))
    if GROUPS > 0 and TOPK_GROUPS < GROUPS:
        group_of = experts // PER
        gids = tl.arange(0, G_POW2)
        group_score = tl.full((BLOCK_T, G_POW2), float("-inf"), tl.float32)
        for g in tl.static_range(GROUPS):
            inside = (group_of == g) & emask
            vals = tl.where(inside[None, :], biased, float("-inf"))
            top1, at1 = _first_max(vals, experts, E_POW2)
            second = tl.where(experts[None, :] == at1[:, None], float("-inf"), vals)
            top2 = tl.max(second, axis=1)
            total = tl.where(PER > 1, top1 + top2, top1)
            group_score = tl.where(gids[None, :] == g, total[:, None], group_score)
        keep = tl.zeros((BLOCK_T, G_POW2), dtype=tl.int1)
        for _ in tl.static_range(TOPK_GROUPS):
            best, at = _first_max(group_score, gids, G_POW2)
            pick = gids[None, :] == at[:, None]
            keep = keep | pick
            group_score = tl.where(pick, float("-inf"), group_score)
        kept = tl.sum(tl.where((group_of[None, None, :] == gids[None, :, None]) & keep[:, :, None], 1, 0), axis=1) > 0
        biased = tl.where(kept, biased, float("-inf"))
    slots = tl.arange(0, K_POW2)
    chosen_idx = tl.zeros((BLOCK_T, K_POW2), dtype=tl.int32)
    chosen_w = tl.zeros((BLOCK_T, K_POW2), dtype=tl.float32)
    if HAS_FIXED:
        fixed = tl.load(fix_ptr + tokens, mask=tmask, other=0) != 0
    for k in tl.static_range(TOPK):
        best, at = _first_max(biased, experts, E_POW2)
        pick = experts[None, :] == at[:, None]
        biased = tl.where(pick, float("-inf"), biased)
        if HAS_FIXED:
            given = tl.load(fixed_ptr + tokens.to(tl.int64) * stride_f + k, mask=tmask & fixed, other=0).to(tl.int32)
            at = tl.where(fixed, given, at)
        w = tl.sum(tl.where(experts[None, :] == at[:, None], scores, 0.0), axis=1)
        chosen_idx = tl.where(slots[None, :] == k, at[:, None], chosen_idx)
        chosen_w = tl.where(slots[None, :] == k, w[:, None], chosen_w)
    if NORMALIZE:
        denominator = tl.zeros((BLOCK_T,), tl.float32)
        for k in tl.static_range(TOPK):
            denominator += tl.sum(tl.where(slots[None, :] == k, chosen_w, 0.0), axis=1)
        chosen_w = tl.math.div_rn(chosen_w, (denominator + 1e-20)[:, None])
    chosen_w = chosen_w * factor
    routed = tmask
    if HAS_MASK:
        routed = tl.load(mask_ptr + tokens, mask=tmask, other=0) != 0
    out_idx = tl.where(routed[:, None], chosen_idx.to(tl.int64), -1)
    out_w = tl.where(routed[:, None], chosen_w, 0.0)
    smask = tmask[:, None] & (slots[None, :] < TOPK)
    tl.store(idx_ptr + tokens[:, None].to(tl.int64) * stride_i + slots[None, :], out_idx, mask=smask)
    tl.store(w_ptr + tokens[:, None].to(tl.int64) * stride_w + slots[None, :], out_w, mask=smask)


@serialized
def top2_sum_gate(logits: torch.Tensor, bias: torch.Tensor | None, num_topk: int, num_topk_groups: int,
                  num_groups: int, routed_scaling_factor: float = 1.0, scoring_func: str = "sigmoid",
                  normalize: bool = True, mask: torch.Tensor | None = None, fixed_topk_idx: torch.Tensor | None = None,
                  fix_routing_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits fp32 [T, E] -> (topk_idx int64 [T, num_topk], topk_weights fp32 [T, num_topk]).
    fix_routing_mask bool [T] with fixed_topk_idx int [T, num_topk]: those tokens keep these experts
    (ids must lie in [0, E): they are read without a bound check, as the contract's caller ensures)."""
    _checks.tensor(OP, "logits", logits, (torch.float32,), (None, None))
    t, e = logits.shape
    _checks.inner_contiguous(OP, "logits", logits)
    if bias is not None:
        _checks.tensor(OP, "bias", bias, (torch.float32,), (e,), logits.device)
        _checks.contiguous(OP, "bias", bias)
    if mask is not None:
        _checks.tensor(OP, "mask", mask, (torch.bool,), (t,), logits.device)
    if (fixed_topk_idx is None) != (fix_routing_mask is None):
        _checks.fail(OP, "fix_routing_mask", "given without fixed_topk_idx (or the reverse)", "both or neither",
                     "pass both")
    if fix_routing_mask is not None:
        _checks.tensor(OP, "fix_routing_mask", fix_routing_mask, (torch.bool,), (t,), logits.device)
        _checks.tensor(OP, "fixed_topk_idx", fixed_topk_idx, (torch.int32, torch.int64), (t, num_topk),
                       logits.device)
    if scoring_func not in SCORING:
        _checks.fail(OP, "scoring_func", repr(scoring_func), f"one of {tuple(SCORING)}", "use 'sigmoid'")
    grouped = num_groups > 0 and num_topk_groups < num_groups
    if num_groups and e % num_groups:
        _checks.fail(OP, "num_groups", num_groups, f"a divisor of E = {e}", "split experts into equal groups")
    allowed = num_topk_groups * (e // num_groups) if grouped else e
    if not 1 <= num_topk <= allowed:
        _checks.fail(OP, "num_topk", num_topk, f"in [1, {allowed}]", "choose fewer experts")
    idx = torch.empty(t, num_topk, dtype=torch.int64, device=logits.device)
    weights = torch.empty(t, num_topk, dtype=torch.float32, device=logits.device)
    if t == 0:
        return idx, weights
    per = e // num_groups if num_groups else e
    fixed = fixed_topk_idx.contiguous() if fixed_topk_idx is not None else idx
    moe_gate_kernel[(triton.cdiv(t, BLOCK_T),)](
        logits, bias if bias is not None else logits, mask if mask is not None else logits,
        fix_routing_mask if fix_routing_mask is not None else logits, fixed, idx, weights, t, e, per,
        float(routed_scaling_factor), logits.stride(0), fixed.stride(0), idx.stride(0), weights.stride(0),
        TOPK=num_topk, TOPK_GROUPS=num_topk_groups, GROUPS=num_groups if grouped else 0, HAS_BIAS=bias is not None,
        HAS_MASK=mask is not None, HAS_FIXED=fix_routing_mask is not None, SCORING=SCORING[scoring_func],
        NORMALIZE=normalize,
        E_POW2=triton.next_power_of_2(e), G_POW2=triton.next_power_of_2(max(num_groups, 1)),
        K_POW2=triton.next_power_of_2(num_topk), BLOCK_T=BLOCK_T, THRESHOLD=SOFTPLUS_THRESHOLD)
    return idx, weights
