"""Conformance cases for the MoE routing family, and the checkers tests reuse.

The gate is checked by properties on random logits (chosen groups and experts optimal up to a
rounding margin, weights against fp64) and exactly on constructed ties (identical groups, duplicated
experts: the smaller index must win). The mapping is checked by properties (its row order inside
an expert is unspecified); expand bit for bit; reduce against an fp64 sum with NaN in padding rows.
"""

from __future__ import annotations

import functools

import torch

from ..layouts import contiguous_m_indices
from ..ops.moe_routing import (GROUP_SCORE_TOPK, NORMALIZE_EPS, NORMALIZE_WEIGHT, REDUCE_FUSED, TOP2_SUM_GATE,
                           FusedMapping, expand_to_fused, expand_to_fused_with_sf, get_fused_mapping,
                           normalize_weight, reduce_fused, top2_sum_gate, top2_sum_gate_reference)
from ..ops.quant.fp8 import per_token_cast_to_fp8
from .checks import assert_close
from .core import Case, CaseFailure, conformance_cases
from .generators import generator, randn

#: a score difference below this may be ordered either way by a correct kernel (fp32 rounding)
SCORE_MARGIN = 1e-5
#: calc_diff bound when the output is rounded to bf16 / fp8 (the rounding dominates)
BF16_OUTPUT_BOUND = 1e-5
FP8_OUTPUT_BOUND = 1e-4


def gate_scores64(logits: torch.Tensor, bias: torch.Tensor | None, scoring_func: str) -> tuple[torch.Tensor, ...]:
    """(scores, ranked scores) in fp64; softmax ranks the logits (+ bias)."""
    x = logits.double().cpu()
    if scoring_func == "sigmoid":
        scores = torch.sigmoid(x)
    elif scoring_func == "softmax":
        scores = torch.softmax(x, dim=-1)
    else:
        scores = torch.nn.functional.softplus(x).sqrt()
    base = x if scoring_func == "softmax" else scores
    return scores, base if bias is None else base + bias.double().cpu()


def gate_weights64(scores: torch.Tensor, idx: torch.Tensor, routed_scaling_factor: float,
                   normalize: bool) -> torch.Tensor:
    """fp64 weights of the chosen experts (idx >= 0 everywhere)."""
    w = scores.gather(1, idx)
    if normalize:
        w = w / (w.sum(1, keepdim=True) + NORMALIZE_EPS)
    return w * routed_scaling_factor


def check_gate(logits: torch.Tensor, bias: torch.Tensor | None, num_topk: int, num_topk_groups: int, num_groups: int,
               topk_idx: torch.Tensor, topk_weights: torch.Tensor, *, routed_scaling_factor: float = 1.0,
               scoring_func: str = "sigmoid", normalize: bool = True, mask: torch.Tensor | None = None,
               margin: float = SCORE_MARGIN) -> float:
    """Raise CaseFailure unless the gate output is a valid choice; return the weights' calc_diff."""
    t, e = logits.shape
    if topk_idx.dtype != torch.int64 or tuple(topk_idx.shape) != (t, num_topk):
        raise CaseFailure(f"topk_idx: {topk_idx.dtype} {tuple(topk_idx.shape)}, expected int64 {(t, num_topk)}")
    if topk_weights.dtype != torch.float32 or tuple(topk_weights.shape) != (t, num_topk):
        raise CaseFailure(f"topk_weights: {topk_weights.dtype} {tuple(topk_weights.shape)}, expected fp32")
    idx, w = topk_idx.cpu(), topk_weights.cpu()
    routed = torch.ones(t, dtype=torch.bool) if mask is None else mask.cpu()
    if bool((idx[~routed] != -1).any()) or bool((w[~routed] != 0).any()):
        raise CaseFailure("masked tokens must get topk_idx -1 and weight 0")
    idx, w, logits_r = idx[routed], w[routed], logits.cpu()[routed]
    if idx.numel() and (bool((idx < 0).any()) or bool((idx >= e).any())):
        raise CaseFailure(f"topk_idx: values outside [0, {e})")
    if num_topk > 1 and bool((idx.sort(1).values.diff(dim=1) == 0).any()):
        raise CaseFailure("topk_idx: an expert chosen twice for one token")
    scores, biased = gate_scores64(logits_r, bias, scoring_func)
    n = idx.shape[0]
    allowed = torch.ones(n, e, dtype=torch.bool)
    if num_groups and num_topk_groups < num_groups:
        per = e // num_groups
        group_score = biased.view(n, num_groups, per).topk(min(GROUP_SCORE_TOPK, per), -1).values.sum(-1)
        kth = group_score.topk(num_topk_groups, 1).values[:, -1:]
        chosen_groups = torch.div(idx, per, rounding_mode="floor")
        if bool((group_score.gather(1, chosen_groups) < kth - margin).any()):
            raise CaseFailure("an expert was chosen from a group outside the top num_topk_groups groups")
        used = torch.zeros(n, num_groups, dtype=torch.bool).scatter_(1, chosen_groups, True)
        if bool((used.sum(1) > num_topk_groups).any()):
            raise CaseFailure("experts were chosen from more than num_topk_groups groups")
        # groups certainly kept: strictly above the cut (by more than the margin)
        allowed = (group_score > kth + margin).repeat_interleave(per, 1)
    picked = torch.zeros(n, e, dtype=torch.bool).scatter_(1, idx, True) if n else allowed & False
    chosen_min = biased.gather(1, idx).amin(1) if n else torch.zeros(0)
    rest_max = torch.where(allowed & ~picked, biased, float("-inf")).amax(1) if n else torch.zeros(0)
    if bool((chosen_min < rest_max - margin).any()):
        raise CaseFailure("an unchosen expert of a kept group scores higher than a chosen one")
    if num_topk > 1 and n and bool((biased.gather(1, idx).diff(dim=1) > margin).any()):
        raise CaseFailure("topk_idx: experts are not listed best first")
    if not n:
        return 0.0
    return assert_close(w, gate_weights64(scores, idx, routed_scaling_factor, normalize),
                        TOP2_SUM_GATE.tolerance.dequantized, "topk_weights vs fp64")


def tied_gate_logits(t: int, e: int, num_groups: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and bias whose groups are identical and whose experts come in equal pairs, so only the
    tie rule (smaller index first) decides; every implementation computes the same fp32 ties."""
    per = e // max(num_groups, 1)
    base, bias = randn(t, per, seed=seed), randn(per, seed=seed + 1, scale=0.1)
    for v in (base, bias):
        v[..., 1::2] = v[..., 0::2][..., : v[..., 1::2].shape[-1]]
    return base.repeat(1, max(num_groups, 1)), bias.repeat(max(num_groups, 1))


def check_fused_mapping(topk_idx: torch.Tensor, num_experts: int, alignment: int, mapping: FusedMapping,
                        num_expanded_tokens: int | None = None) -> None:
    """Raise CaseFailure unless `mapping` is the fused layout of topk_idx (any row order inside an expert)."""
    if not isinstance(mapping, tuple) or len(mapping) != 8:
        raise CaseFailure(f"get_fused_mapping returned {type(mapping).__name__}, expected an 8-tuple")
    (pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end, per_expert,
     per_expert_list) = mapping
    idx = topk_idx.cpu().to(torch.int64)
    t, k = idx.shape
    for name, tensor in zip(FusedMapping._fields[:7], mapping[:7]):
        if tensor.dtype != torch.int32:
            raise CaseFailure(f"{name}: dtype {tensor.dtype}, expected int32")
    counts = torch.bincount(idx[idx >= 0], minlength=num_experts)
    m_indices = contiguous_m_indices(counts, alignment).to(torch.int64)
    rows = pos_to_expert.numel()
    if num_expanded_tokens is not None and rows != num_expanded_tokens:
        raise CaseFailure(f"pos_to_expert has {rows} rows, expected {num_expanded_tokens}")
    want = torch.full((rows,), -1, dtype=torch.int64)
    if rows < m_indices.numel():
        raise CaseFailure(f"{rows} rows cannot hold the aligned segments ({m_indices.numel()} rows)")
    want[: m_indices.numel()] = m_indices
    if not torch.equal(pos_to_expert.cpu().to(torch.int64), want):
        raise CaseFailure("pos_to_expert differs from the grouped GEMM's m_indices for these counts")
    aligned = (counts + alignment - 1) // alignment * alignment
    start = torch.cumsum(aligned, 0) - aligned
    for name, got, exp in (("num_tokens_per_expert", per_expert, aligned), ("expert_start", expert_start, start),
                           ("expert_end", expert_end, start + aligned)):
        if not torch.equal(got.cpu().to(torch.int64), exp):
            raise CaseFailure(f"{name}: {got.tolist()} expected {exp.tolist()}")
    if per_expert_list and list(per_expert_list) != aligned.tolist():
        raise CaseFailure("num_tokens_per_expert_list differs from num_tokens_per_expert")
    pos = token_topk_to_pos.cpu().to(torch.int64)
    if tuple(pos.shape) != (t, k):
        raise CaseFailure(f"token_topk_to_pos: shape {tuple(pos.shape)}, expected {(t, k)}")
    valid = idx >= 0
    if not torch.equal(pos >= 0, valid) or bool((pos >= rows).any()):
        raise CaseFailure("token_topk_to_pos: -1 exactly where topk_idx is negative, else a row < P")
    p = pos[valid]
    if p.numel() and int(torch.bincount(p, minlength=rows).max()) > 1:
        raise CaseFailure("token_topk_to_pos: two (token, slot) pairs share a row")
    token = torch.arange(t)[:, None].expand(t, k)[valid]
    flat = (torch.arange(t)[:, None] * k + torch.arange(k)[None, :])[valid]
    if not (torch.equal(pos_to_expert.cpu().to(torch.int64)[p], idx[valid])
            and torch.equal(pos_to_token.cpu().to(torch.int64)[p], token)
            and torch.equal(pos_to_token_topk.cpu().to(torch.int64)[p], flat)):
        raise CaseFailure("pos_to_expert / pos_to_token / pos_to_token_topk disagree with token_topk_to_pos")
    padding = pos_to_expert.cpu() < 0
    if bool((pos_to_token.cpu()[padding] != -1).any()) or bool((pos_to_token_topk.cpu()[padding] != -1).any()):
        raise CaseFailure("padding rows must have pos_to_token and pos_to_token_topk -1")


def random_topk_idx(t: int, k: int, num_experts: int, seed: int, padding: float = 0.1,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """int64 [t, k]: distinct experts per token (a random permutation prefix), some slots -1."""
    g = generator(seed)
    idx = torch.rand(t, num_experts, generator=g).argsort(1)[:, :k]
    idx[torch.rand(t, k, generator=g) < padding] = -1
    return idx.to(device)


# ---------------------------------------------------------------------------------------------
# cases


def _gate_case(t: int, e: int, k: int, topk_groups: int, groups: int, factor: float, scoring: str, normalize: bool,
               with_bias: bool, with_mask: bool, tied: bool, seed: int, device: torch.device) -> float:
    if tied:
        logits, bias = tied_gate_logits(t, e, groups, seed)
    else:
        logits, bias = randn(t, e, seed=seed, scale=2.0), randn(e, seed=seed + 1, scale=0.1)
    logits, bias = logits.to(device), (bias.to(device) if with_bias else None)
    mask = (torch.rand(t, generator=generator(seed + 2)) > 0.2).to(device) if with_mask else None
    idx, w = top2_sum_gate(logits, bias, k, topk_groups, groups, routed_scaling_factor=factor, scoring_func=scoring,
                           mask=mask, normalize=normalize)
    err = check_gate(logits, bias, k, topk_groups, groups, idx, w, routed_scaling_factor=factor,
                     scoring_func=scoring, normalize=normalize, mask=mask)
    if tied:
        want, _ = top2_sum_gate_reference(logits.cpu(), None if bias is None else bias.cpu(), k, topk_groups,
                                          groups, factor, scoring, normalize, None if mask is None else mask.cpu())
        if not torch.equal(idx.cpu(), want):
            raise CaseFailure("exact ties: topk_idx differs from the smaller-index-first choice")
    return err


GATE_QUICK = [
    # t, e, k, topk_groups, groups, factor, scoring, normalize, bias, mask, tied
    (16, 64, 8, 4, 8, 2.5, "sigmoid", True, True, False, False),
    (7, 32, 4, 2, 4, 1.0, "sigmoid", False, True, True, False),
    (9, 16, 3, 0, 0, 1.5, "sqrtsoftplus", True, False, False, False),
    (5, 24, 6, 3, 3, 1.0, "sigmoid", True, True, False, False),
    (6, 32, 4, 2, 8, 2.5, "sigmoid", True, True, False, True),
    (4, 16, 5, 0, 0, 1.0, "sigmoid", True, False, True, True),
    (0, 16, 2, 1, 4, 1.0, "sigmoid", True, True, False, False),
]
GATE_FULL = GATE_QUICK + [
    (512, 256, 8, 4, 8, 2.5, "sigmoid", True, True, True, False),
    (256, 256, 8, 4, 8, 2.5, "sigmoid", True, True, False, True),
]


@conformance_cases("top2_sum_gate")
def gate_cases(quick: bool) -> list[Case]:
    out = []
    for i, spec in enumerate(GATE_QUICK if quick else GATE_FULL):
        t, e, k, tg, g, factor, scoring, norm, bias, mask, tied = spec
        label = (f"T={t} E={e} k={k} groups={tg}/{g} x{factor} {scoring} normalize={norm} bias={bias} "
                 f"mask={mask} tied={tied}")
        out.append(Case("top2_sum_gate", label, 5000 + 10 * i, functools.partial(_gate_case, *spec, 5000 + 10 * i)))
    return out


def _normalize_case(t: int, k: int, seed: int, device: torch.device) -> float:
    w = randn(t, k, seed=seed, device=device).abs() + 0.01
    denominator, normalized = normalize_weight(w)
    w64 = w.double().cpu()
    d64 = w64.sum(1) + NORMALIZE_EPS
    bound = NORMALIZE_WEIGHT.tolerance.dequantized
    return max(assert_close(denominator, d64, bound, "denominator"),
               assert_close(normalized, w64 / d64[:, None], bound, "normalized"))


@conformance_cases("normalize_weight")
def normalize_cases(quick: bool) -> list[Case]:
    shapes = [(1, 1), (33, 8), (0, 4)] + ([] if quick else [(4096, 8)])
    return [Case("normalize_weight", f"T={t} k={k}", 5200 + i, functools.partial(_normalize_case, t, k, 5200 + i))
            for i, (t, k) in enumerate(shapes)]


def _mapping_case(t: int, k: int, e: int, alignment: int, padding: float, mode: str, seed: int,
                  device: torch.device) -> float:
    idx = random_topk_idx(t, k, e, seed, padding, device)
    if mode == "int32":
        idx = idx.to(torch.int32)
    if mode == "sized":
        needed = int(((torch.bincount(idx[idx >= 0].cpu(), minlength=e) + alignment - 1) // alignment
                      * alignment).sum())
        mapping = get_fused_mapping(idx, e, needed + 3 * alignment, alignment)
        check_fused_mapping(idx, e, alignment, mapping, needed + 3 * alignment)
    elif mode == "no_sync":
        mapping = get_fused_mapping(idx, e, 0, alignment, force_no_sync=True)
        bound = -(-(t * k + (alignment - 1) * e) // alignment) * alignment
        check_fused_mapping(idx, e, alignment, mapping, bound)
        if mapping.num_tokens_per_expert_list:
            raise CaseFailure("force_no_sync: num_tokens_per_expert_list must be empty")
    else:
        mapping = get_fused_mapping(idx, e, 0, alignment)
        check_fused_mapping(idx, e, alignment, mapping)
        if mapping.num_tokens_per_expert_list != mapping.num_tokens_per_expert.tolist():
            raise CaseFailure("num_tokens_per_expert_list must be filled when the call syncs")
    return 0.0


MAPPING_QUICK = [
    # t, k, e, alignment, padding fraction, mode
    (37, 8, 32, 128, 0.1, "exact"),
    (20, 4, 8, 4, 0.3, "int32"),
    (16, 6, 16, 8, 0.0, "sized"),
    (9, 2, 5, 16, 0.5, "no_sync"),
    (6, 3, 4, 1, 1.0, "exact"),
    (0, 8, 16, 128, 0.0, "exact"),
]
MAPPING_FULL = MAPPING_QUICK + [(4096, 8, 256, 128, 0.02, "exact"), (2048, 8, 64, 256, 0.1, "sized")]


@conformance_cases("get_fused_mapping")
def mapping_cases(quick: bool) -> list[Case]:
    out = []
    for i, spec in enumerate(MAPPING_QUICK if quick else MAPPING_FULL):
        t, k, e, a, pad, mode = spec
        out.append(Case("get_fused_mapping", f"T={t} k={k} E={e} align={a} padding={pad} {mode}", 5300 + i,
                        functools.partial(_mapping_case, *spec, 5300 + i)))
    return out


def expected_expand_bytes(x: torch.Tensor, pos_to_token: torch.Tensor) -> torch.Tensor:
    """uint8 [P, H·itemsize]: each row the bytes of x[pos_to_token] (a gather, not the op's scatter), zero
    where pos_to_token is -1."""
    src = pos_to_token.cpu().to(torch.int64)
    rows = x.cpu().contiguous().view(torch.uint8)[src.clamp(min=0)]
    return torch.where((src >= 0)[:, None], rows, 0)


def _expand_case(t: int, k: int, e: int, h: int, alignment: int, dtype: torch.dtype, seed: int,
                 device: torch.device) -> float:
    idx = random_topk_idx(t, k, e, seed, 0.1, device)
    mapping = get_fused_mapping(idx, e, 0, alignment)
    x = randn(t, h, seed=seed + 1, dtype=dtype, device=device)
    out = expand_to_fused(x, mapping.token_topk_to_pos, mapping.pos_to_expert)
    if out.dtype != dtype or tuple(out.shape) != (mapping.pos_to_expert.numel(), h):
        raise CaseFailure(f"out: {out.dtype} {tuple(out.shape)}")
    if not torch.equal(out.cpu().contiguous().view(torch.uint8), expected_expand_bytes(x, mapping.pos_to_token)):
        raise CaseFailure("expanded rows differ from x[pos_to_token] (padding rows must be zero)")
    return 0.0


@conformance_cases("expand_to_fused")
def expand_cases(quick: bool) -> list[Case]:
    specs = [(13, 4, 8, 128, 8, torch.bfloat16), (9, 2, 4, 64, 4, torch.float32), (0, 2, 4, 16, 4, torch.bfloat16)]
    if not quick:
        specs.append((1024, 8, 64, 2048, 128, torch.bfloat16))
    return [Case("expand_to_fused", f"T={s[0]} k={s[1]} E={s[2]} H={s[3]} align={s[4]} {str(s[5])[6:]}", 5400 + i,
                 functools.partial(_expand_case, *s, 5400 + i)) for i, s in enumerate(specs)]


def _packed_words(t: int, words: int, seed: int) -> torch.Tensor:
    """int32 [t, words] of UE8M0 exponent bytes (1..254); about a quarter of the words read as NaN
    when viewed as fp32, so a provider that does arithmetic on the words instead of copying shows."""
    exps = torch.randint(1, 255, (t, words, 4), generator=generator(seed), dtype=torch.int32)
    nan_like = torch.rand(t, words, generator=generator(seed + 1)) < 0.25
    exps[..., 3] = torch.where(nan_like, 0x7F, exps[..., 3])
    exps[..., 2] = torch.where(nan_like, exps[..., 2] | 0x80, exps[..., 2])
    return exps.to(torch.uint8).view(torch.int32).view(t, words)


def _expand_sf_case(t: int, k: int, e: int, h: int, alignment: int, col_major: bool, packed: bool, seed: int,
                    device: torch.device) -> float:
    idx = random_topk_idx(t, k, e, seed, 0.1, device)
    mapping = get_fused_mapping(idx, e, 0, alignment)
    q = per_token_cast_to_fp8(randn(t, h, seed=seed + 1, dtype=torch.bfloat16, device=device))
    scale = _packed_words(t, -(-h // 512), seed + 2).to(device) if packed else q.scale
    out, out_sf = expand_to_fused_with_sf((q.data, scale), 128, mapping.token_topk_to_pos, mapping.pos_to_expert,
                                          use_tma_aligned_col_major_sf=col_major)
    want = expected_expand_bytes(q.data, mapping.pos_to_token)
    want_sf = expected_expand_bytes(scale, mapping.pos_to_token)
    if out_sf.dtype != scale.dtype:
        raise CaseFailure(f"out_sf is {out_sf.dtype}; expected the input scales' {scale.dtype}")
    if not (torch.equal(out.cpu().view(torch.uint8), want)
            and torch.equal(out_sf.cpu().contiguous().view(torch.uint8), want_sf)):
        raise CaseFailure("expanded fp8 rows or scales differ from the token's (padding must be zero)")
    if col_major and out_sf.numel() and out_sf.stride() != (1, -(-out_sf.shape[0] // 4) * 4):
        raise CaseFailure(f"col-major scales: strides {out_sf.stride()}, expected (1, align(P, 4))")
    return 0.0


@conformance_cases("expand_to_fused_with_sf")
def expand_sf_cases(quick: bool) -> list[Case]:
    specs = [(11, 4, 8, 256, 8, False, False), (7, 3, 6, 384, 4, True, False), (9, 4, 8, 640, 4, True, True),
             (6, 2, 4, 256, 8, False, True)]
    if not quick:
        specs.append((1024, 8, 64, 7168, 128, True, False))
    return [Case("expand_to_fused_with_sf", f"T={s[0]} k={s[1]} E={s[2]} H={s[3]} align={s[4]} col_major={s[5]} "
                 f"packed={s[6]}", 5500 + i, functools.partial(_expand_sf_case, *s, 5500 + i))
            for i, s in enumerate(specs)]


def reduce_reference64(y: torch.Tensor, topk_weights: torch.Tensor | None, token_topk_to_pos: torch.Tensor,
                       y_sf: torch.Tensor | None = None) -> torch.Tensor:
    """fp64 [T, H] weighted sum written as a loop over the k slots (a different route than the op's)."""
    pos = token_topk_to_pos.cpu().to(torch.int64)
    t, k = pos.shape
    out = torch.zeros(t, y.shape[1], dtype=torch.float64)
    for j in range(k):
        ok = pos[:, j] >= 0
        scale = torch.ones(t, dtype=torch.float64) if topk_weights is None else topk_weights.cpu()[:, j].double()
        if y_sf is not None:
            scale = scale * torch.where(ok, y_sf.cpu().double()[pos[:, j].clamp(min=0)], 0.0)
        out[ok] += y.cpu().double()[pos[ok, j]] * scale[ok, None]
    return out


def _reduce_case(t: int, k: int, e: int, h: int, alignment: int, dtype: torch.dtype, weighted: bool, with_sf: bool,
                 fp8: bool, seed: int, device: torch.device) -> float:
    idx = random_topk_idx(t, k, e, seed, 0.15, device)
    mapping = get_fused_mapping(idx, e, 0, alignment)
    rows = mapping.pos_to_expert.numel()
    y = randn(rows, h, seed=seed + 1, device=device)
    y[mapping.pos_to_expert < 0] = float("nan")  # padding rows must never be read
    y = y.to(dtype)
    w = randn(t, k, seed=seed + 2, device=device).abs() if weighted else None
    y_sf = (randn(rows, seed=seed + 3, device=device).abs() + 0.5) if with_sf else None
    x = (y, y_sf) if with_sf else y
    sf = torch.tensor([0.25], device=device) if fp8 else None
    out = reduce_fused(x, w, mapping.token_topk_to_pos, fp8_format="e4m3" if fp8 else "", sf=sf)
    ref = reduce_reference64(y, w, mapping.token_topk_to_pos, y_sf)
    if fp8:
        ref = (ref * 0.25).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).double()
        return assert_close(out.float(), ref, FP8_OUTPUT_BOUND, "fp8 out vs fp64 sum")
    bound = REDUCE_FUSED.tolerance.dequantized if dtype == torch.float32 else BF16_OUTPUT_BOUND
    return assert_close(out, ref, bound, "out vs fp64 sum")


@conformance_cases("reduce_fused")
def reduce_cases(quick: bool) -> list[Case]:
    specs = [
        # t, k, e, h, alignment, dtype, weighted, x_sf, fp8 out
        (13, 4, 8, 64, 8, torch.float32, True, False, False),
        (17, 6, 16, 128, 4, torch.bfloat16, True, True, False),
        (9, 2, 4, 32, 16, torch.float32, False, False, False),
        (11, 3, 8, 64, 4, torch.float32, True, False, True),
        (0, 4, 8, 32, 8, torch.bfloat16, True, False, False),
    ]
    if not quick:
        specs.append((1024, 8, 64, 2048, 128, torch.bfloat16, True, False, False))
    return [Case("reduce_fused", f"T={s[0]} k={s[1]} E={s[2]} H={s[3]} align={s[4]} {str(s[5])[6:]} "
                 f"weighted={s[6]} x_sf={s[7]} fp8={s[8]}", 5600 + i, functools.partial(_reduce_case, *s, 5600 + i))
            for i, s in enumerate(specs)]
