"""MoE routing op family (TileKernels `tile_kernels.moe` names and argument order): the DeepSeek-V3
grouped top-k gate, weight normalization, and the fused expert-major mapping with expand / reduce.

Gate contract (`top2_sum_gate`): scores = sigmoid(logits) (or sqrt(softplus(logits))); biased =
scores + bias (selection only); experts are split into num_groups equal groups, each group scored by
the sum of its top-2 biased scores; the num_topk_groups best groups are kept and the num_topk best
experts inside them chosen. Every ranking is stable: among equal values the smaller index wins, and
the chosen experts are listed by biased score, best first. Weights = unbiased scores of the chosen
experts, divided by (their sum + 1e-20) when normalize, times routed_scaling_factor.

Fused layout (`get_fused_mapping`): every (token, slot) with a non-negative expert id gets one row of
an expert-major buffer; expert e owns rows [expert_start[e], expert_end[e]), its count padded up to
`alignment` — DeepGEMM's contiguous grouped-GEMM layout, so `pos_to_expert` is exactly the grouped
GEMM's `m_indices` (-1 on padding rows). Negative expert ids are padding and map nowhere (-1). The
order of rows inside one expert's segment is unspecified (the cpu provider uses token order).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from .contract import OpContract, Tolerance, bind, checks_values, public_op, register_contract
from .errors import ContractError, format_problem
from .layouts import FP8_E4M3_MAX, aligned_counts, contiguous_m_indices, segment_starts
from .tensors import FP8_DTYPE, PreparedTensor, QuantTensor, cdiv, describe

#: scoring functions of the gate (TileKernels names); softmax is not in this contract
SCORING_FUNCS = ("sigmoid", "sqrtsoftplus")
#: a group's score is the sum of its best GROUP_SCORE_TOPK biased expert scores (DeepSeek-V3)
GROUP_SCORE_TOPK = 2
#: added to the weight sum before dividing (TileKernels' normalizer)
NORMALIZE_EPS = 1e-20
MAPPING_DTYPE = torch.int32
INDEX_DTYPES = (torch.int32, torch.int64)
REDUCE_DTYPES = (torch.bfloat16, torch.float32)
FP8_FORMATS = ("", "e4m3")

_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(x: torch.Tensor) -> torch.Tensor:
    """`x` viewed as the integer dtype of its width, so copies are bit-exact for every dtype (fp8 too)."""
    return x.view(_SAME_WIDTH_INT[x.element_size()])


# ---------------------------------------------------------------------------------------------
# reference math


def score_reference(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    """Expert scores in fp32 [T, E]."""
    x = logits.float()
    if scoring_func == "sigmoid":
        return torch.sigmoid(x)
    return F.softplus(x).sqrt()


def _stable_top(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest along the last dim, best first, equal values to the smaller index."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


def top2_sum_gate_reference(logits: torch.Tensor, bias: torch.Tensor | None, num_topk: int, num_topk_groups: int,
                            num_groups: int, routed_scaling_factor: float = 1.0, scoring_func: str = "sigmoid",
                            normalize: bool = True,
                            mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference gate: logits fp32 [T, E] -> (topk_idx int64 [T, k], topk_weights fp32 [T, k])."""
    scores = score_reference(logits, scoring_func)
    biased = scores if bias is None else scores + bias.float()
    t, e = scores.shape
    if num_groups and num_topk_groups < num_groups:
        per_group = e // num_groups
        grouped = biased.view(t, num_groups, per_group)
        group_score = grouped.topk(min(GROUP_SCORE_TOPK, per_group), dim=-1).values.sum(-1)
        keep = torch.zeros(t, num_groups, dtype=torch.bool, device=logits.device)
        keep.scatter_(1, _stable_top(group_score, num_topk_groups), True)
        biased = biased.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
    idx = _stable_top(biased, num_topk)
    weights = scores.gather(1, idx)
    if normalize:
        weights = weights / (weights.sum(-1, keepdim=True) + NORMALIZE_EPS)
    weights = weights * routed_scaling_factor
    if mask is not None:
        idx = idx.masked_fill(~mask[:, None], -1)
        weights = weights.masked_fill(~mask[:, None], 0.0)
    return idx, weights


def normalize_weight_reference(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(denominator fp32 [T] = Σ weights + 1e-20, normalized fp32 [T, k] = weights / denominator)."""
    denominator = topk_weights.float().sum(-1) + NORMALIZE_EPS
    return denominator, topk_weights.float() / denominator[:, None]


def fused_mapping_reference(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int,
                            alignment: int) -> tuple[torch.Tensor, ...]:
    """Reference mapping; rows of one expert in (token, slot) order. Returns int32 tensors
    (pos_to_expert [P], pos_to_token [P], pos_to_token_topk [P], token_topk_to_pos [T, k],
    expert_start [E], expert_end [E], num_tokens_per_expert [E] (aligned counts))."""
    t, k = topk_idx.shape
    device = topk_idx.device
    flat = topk_idx.reshape(-1).to(torch.int64)
    valid = flat >= 0
    counts = torch.bincount(flat[valid], minlength=num_experts)
    aligned = aligned_counts(counts, alignment)
    start = segment_starts(counts, alignment).to(torch.int64)
    # sort (token, slot) entries by expert, keeping token order inside an expert; padding sorts last
    key = torch.where(valid, flat, num_experts)
    order = torch.sort(key, stable=True).indices
    sorted_expert = key[order]
    n_valid = int(valid.sum())
    first_of_expert = torch.cumsum(counts, 0) - counts
    e_sorted = sorted_expert[:n_valid]
    rank = torch.arange(n_valid, device=device) - first_of_expert[e_sorted]
    pos = start[e_sorted] + rank
    token_topk_to_pos = torch.full((t * k,), -1, dtype=torch.int64, device=device)
    token_topk_to_pos[order[:n_valid]] = pos
    pos_to_token_topk = torch.full((num_expanded_tokens,), -1, dtype=torch.int64, device=device)
    pos_to_token_topk[pos] = order[:n_valid]
    pos_to_token = torch.where(pos_to_token_topk >= 0, pos_to_token_topk // max(k, 1), -1)
    pos_to_expert = torch.full((num_expanded_tokens,), -1, dtype=MAPPING_DTYPE, device=device)
    m_indices = contiguous_m_indices(counts, alignment)
    pos_to_expert[: m_indices.numel()] = m_indices
    return (pos_to_expert, pos_to_token.to(MAPPING_DTYPE), pos_to_token_topk.to(MAPPING_DTYPE),
            token_topk_to_pos.view(t, k).to(MAPPING_DTYPE), start.to(MAPPING_DTYPE),
            (start + aligned).to(MAPPING_DTYPE), aligned.to(MAPPING_DTYPE))


def expand_to_fused_reference(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
                              x_sf: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Copy token rows (and their per-token scales) to their positions, bit for bit; every other row
    is zero. x [T, H] -> [P, H]; x_sf fp32 [T, S] -> [P, S] or None."""
    num_rows = pos_to_expert.numel()
    pos = token_topk_to_pos.to(torch.int64)
    valid = pos >= 0
    token = torch.arange(pos.shape[0], device=pos.device)[:, None].expand_as(pos)[valid]
    outs = []
    for src in (x, x_sf):
        if src is None:
            outs.append(None)
            continue
        out = torch.zeros(num_rows, src.shape[1], dtype=_bits(src).dtype, device=src.device)
        out[pos[valid]] = _bits(src)[token]
        outs.append(out.view(src.dtype))
    return outs[0], outs[1]


def reduce_fused_reference(x: torch.Tensor, topk_weights: torch.Tensor | None, token_topk_to_pos: torch.Tensor,
                           x_sf: torch.Tensor | None = None, sf: torch.Tensor | None = None,
                           fp8: bool = False) -> torch.Tensor:
    """fp32 [T, H]: Σ over the token's mapped rows of x[pos] · weight (· x_sf[pos]), fp32 accumulation;
    padding slots (pos < 0) contribute nothing and padding rows are never read. With fp8 output the
    sum is multiplied by sf (if given) and clamped to ±448, ready for the cast."""
    pos = token_topk_to_pos.to(torch.int64)
    valid = pos >= 0
    safe = pos.clamp(min=0)
    scale = torch.ones(pos.shape, dtype=torch.float32, device=pos.device) if topk_weights is None \
        else topk_weights.float()
    if x_sf is not None:
        scale = scale * x_sf.float()[safe]
    rows = x.float()[safe] * scale[..., None]
    out = torch.where(valid[..., None], rows, 0.0).sum(1)
    if fp8:
        if sf is not None:
            out = out * sf.float()
        out = out.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return out


def top2_sum_gate_kernel(logits: torch.Tensor, bias: torch.Tensor | None, num_topk: int, num_topk_groups: int,
                         num_groups: int, routed_scaling_factor: float, scoring_func: str, normalize: bool,
                         mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference kernel of top2_sum_gate: returns (topk_idx, topk_weights)."""
    return top2_sum_gate_reference(logits, bias, num_topk, num_topk_groups, num_groups, routed_scaling_factor,
                                   scoring_func, normalize, mask)


def get_fused_mapping_kernel(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int,
                             alignment: int) -> tuple[torch.Tensor, ...]:
    """Reference kernel of get_fused_mapping: the seven mapping tensors."""
    return fused_mapping_reference(topk_idx, num_experts, num_expanded_tokens, alignment)


def expand_to_fused_kernel(x: torch.Tensor, x_sf: torch.Tensor | None, token_topk_to_pos: torch.Tensor,
                           pos_to_expert: torch.Tensor, out: torch.Tensor, out_sf: torch.Tensor | None) -> None:
    """Reference kernel of expand_to_fused(_with_sf): writes out (and out_sf, any strides)."""
    expanded, expanded_sf = expand_to_fused_reference(x, token_topk_to_pos, pos_to_expert, x_sf)
    _bits(out).copy_(_bits(expanded))
    if out_sf is not None:
        out_sf.copy_(expanded_sf)


def reduce_fused_kernel(x: torch.Tensor, x_sf: torch.Tensor | None, topk_weights: torch.Tensor | None,
                        token_topk_to_pos: torch.Tensor, sf: torch.Tensor | None, fp8: bool,
                        out: torch.Tensor) -> None:
    """Reference kernel of reduce_fused: writes the (cast) fp32 sums into out."""
    out.copy_(reduce_fused_reference(x, topk_weights, token_topk_to_pos, x_sf, sf, fp8))


TOP2_SUM_GATE = register_contract(OpContract("top2_sum_gate", top2_sum_gate_reference, Tolerance(dequantized=1e-9),
                                             kernel=top2_sum_gate_kernel))
NORMALIZE_WEIGHT = register_contract(OpContract("normalize_weight", normalize_weight_reference,
                                                Tolerance(dequantized=1e-10), kernel=normalize_weight_reference))
GET_FUSED_MAPPING = register_contract(OpContract("get_fused_mapping", fused_mapping_reference,
                                                 Tolerance(dequantized=0.0), kernel=get_fused_mapping_kernel))
EXPAND_TO_FUSED = register_contract(OpContract("expand_to_fused", expand_to_fused_reference,
                                               Tolerance(dequantized=0.0), kernel=expand_to_fused_kernel))
EXPAND_TO_FUSED_WITH_SF = register_contract(OpContract("expand_to_fused_with_sf", expand_to_fused_reference,
                                                       Tolerance(dequantized=0.0), kernel=expand_to_fused_kernel))
REDUCE_FUSED = register_contract(OpContract("reduce_fused", reduce_fused_reference, Tolerance(dequantized=1e-9),
                                            kernel=reduce_fused_kernel))


class FusedMapping(NamedTuple):
    """What `get_fused_mapping` returns; unpacks as TileKernels' 8-tuple.

    pos_to_expert [P] int32: expert of each row, -1 on padding (= the grouped GEMM's m_indices)
    pos_to_token [P] int32, pos_to_token_topk [P] int32 (token·k + slot): source of each row, -1 on padding
    token_topk_to_pos [T, k] int32: row of each (token, slot), -1 where topk_idx is negative
    expert_start, expert_end [E] int32: each expert's segment [start, end)
    num_tokens_per_expert [E] int32: ALIGNED rows per expert (end - start)
    num_tokens_per_expert_list: the same as Python ints when the call synced, else []
    """

    pos_to_expert: torch.Tensor
    pos_to_token: torch.Tensor
    pos_to_token_topk: torch.Tensor
    token_topk_to_pos: torch.Tensor
    expert_start: torch.Tensor
    expert_end: torch.Tensor
    num_tokens_per_expert: torch.Tensor
    num_tokens_per_expert_list: list[int]


# ---------------------------------------------------------------------------------------------
# validation helpers


def _check_int(op: str, arg: str, value: Any, low: int, high: int | None = None, fix: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        want = f"an int in [{low}, {high}]" if high is not None else f"an int >= {low}"
        raise ContractError(format_problem(op, arg, repr(value), want, fix or f"pass {want}"))


def _check_bool(op: str, arg: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ContractError(format_problem(op, arg, repr(value), "a bool", "pass True or False"))


def _check_tensor(op: str, arg: str, t: Any, dtypes: tuple[torch.dtype, ...], shape: tuple[int | None, ...],
                  device: torch.device | None, fix: str) -> None:
    """dtype in dtypes, len(shape) dims, each fixed size matching (None: any), on `device`."""
    ok_shape = isinstance(t, torch.Tensor) and t.dim() == len(shape) and all(
        s is None or t.shape[i] == s for i, s in enumerate(shape))
    if not ok_shape or t.dtype not in dtypes:
        dims = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        names = "/".join(str(d).replace("torch.", "") for d in dtypes)
        raise ContractError(format_problem(op, arg, describe(t), f"a tensor of dtype {names} and shape {dims}", fix))
    if device is not None and t.device != device:
        raise ContractError(format_problem(op, arg, f"on {t.device}", f"on {device} like the other arguments",
                                           f"move {arg} to {device}"))


def _first_bad(mask: torch.Tensor) -> str:
    where = tuple(int(v) for v in mask.nonzero()[0])
    return f"{int(mask.sum())} bad entries, first at {list(where)}"


def _check_finite(op: str, arg: str, t: torch.Tensor) -> None:
    if not checks_values(t):
        return  # reading device memory would synchronize; see contract.checks_values
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        raise ContractError(format_problem(op, arg, f"not finite ({_first_bad(bad)})", "finite values",
                                           f"find where {arg} became NaN/Inf upstream; the gate cannot rank them"))


def _unpack_mapping(op: str, token_topk_to_pos: Any, pos_to_expert: Any, need_pos_to_expert: bool):
    if isinstance(token_topk_to_pos, FusedMapping):
        if pos_to_expert is not None:
            raise ContractError(format_problem(op, "pos_to_expert", describe(pos_to_expert),
                                               "None when a FusedMapping is passed", "pass either the mapping or "
                                               "(token_topk_to_pos, pos_to_expert), not both"))
        return token_topk_to_pos.token_topk_to_pos, token_topk_to_pos.pos_to_expert
    if need_pos_to_expert and pos_to_expert is None:
        raise ContractError(format_problem(op, "pos_to_expert", "None", "an int32 tensor [P]",
                                           "pass the mapping from get_fused_mapping (or its pos_to_expert)"))
    return token_topk_to_pos, pos_to_expert


def _check_positions(op: str, token_topk_to_pos: torch.Tensor, num_rows: int) -> None:
    if not checks_values(token_topk_to_pos):
        return
    too_big = token_topk_to_pos >= num_rows
    if bool(too_big.any()):
        raise ContractError(format_problem(op, "token_topk_to_pos", f"pointing past the {num_rows} rows "
                                           f"({_first_bad(too_big)})", f"values < {num_rows} (negative = padding)",
                                           "build the mapping with get_fused_mapping for this buffer"))


def _check_expand_mapping(op: str, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> None:
    """Every row with pos_to_expert >= 0 is the target of exactly one (token, slot), and no other row is."""
    num_rows = pos_to_expert.numel()
    _check_positions(op, token_topk_to_pos, num_rows)
    pos = token_topk_to_pos.reshape(-1).to(torch.int64)
    pos = pos[pos >= 0]
    hits = torch.bincount(pos, minlength=num_rows)
    wanted = (pos_to_expert >= 0).to(hits.dtype)
    if not torch.equal(hits, wanted):
        bad = hits != wanted
        raise ContractError(format_problem(op, "token_topk_to_pos", f"inconsistent with pos_to_expert "
                                           f"({_first_bad(bad)}: rows hit twice, hit while padding, or never hit)",
                                           "each non-padding row targeted by exactly one (token, slot)",
                                           "pass token_topk_to_pos and pos_to_expert from the same get_fused_mapping"))


# ---------------------------------------------------------------------------------------------
# public ops


@public_op(TOP2_SUM_GATE)
def top2_sum_gate(logits: torch.Tensor, bias: torch.Tensor | None, num_topk: int, num_topk_groups: int,
                  num_groups: int, use_shared_as_routed: bool = False, num_shared_experts: int = 0,
                  routed_scaling_factor: float = 1.0, ep_rank: int = 0, num_ep_ranks: int = 1, tp_rank: int = 0,
                  num_tp_ranks: int = 1, scoring_func: str = "sigmoid", mask: torch.Tensor | None = None, *,
                  normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 grouped top-k gate (TileKernels `top2_sum_gate`); see the module docstring.

    logits: fp32 [T, E], finite; bias: None or fp32 [E], finite (selection only)
    num_topk: experts per token, 1 <= num_topk <= num_topk_groups · E / num_groups
    num_topk_groups, num_groups: groups kept / groups in all (E % num_groups == 0); both 0: no grouping
    use_shared_as_routed must be False and num_tp_ranks 1 (not in this contract); num_shared_experts,
        ep_rank and num_ep_ranks then have no effect (as in TileKernels without a physical map)
    routed_scaling_factor: multiplies the weights; scoring_func: "sigmoid" or "sqrtsoftplus"
    mask: None or bool [T]; tokens with False get topk_idx -1 and weight 0
    normalize (keyword): divide the chosen weights by their sum (+1e-20) before scaling
    Returns (topk_idx int64 [T, num_topk], best first; topk_weights fp32 [T, num_topk]).
    """
    op = TOP2_SUM_GATE.name
    _check_tensor(op, "logits", logits, (torch.float32,), (None, None), None,
                  "pass router logits as fp32 [num_tokens, num_experts] (logits.float())")
    t, e = logits.shape
    if e == 0:
        raise ContractError(format_problem(op, "logits", "with 0 experts", "at least one expert column",
                                           "pass [num_tokens, num_experts] logits"))
    device = logits.device
    if bias is not None:
        _check_tensor(op, "bias", bias, (torch.float32,), (e,), device, f"pass fp32 [{e}] (one per expert) or None")
    _check_int(op, "num_groups", num_groups, 0)
    _check_int(op, "num_topk_groups", num_topk_groups, 0)
    if (num_groups == 0) != (num_topk_groups == 0):
        raise ContractError(format_problem(op, "num_topk_groups", f"{num_topk_groups} with num_groups={num_groups}",
                                           "both zero (no grouping) or both positive",
                                           "pass num_groups=num_topk_groups=0 to disable group selection"))
    if num_topk_groups > num_groups:
        raise ContractError(format_problem(op, "num_topk_groups", num_topk_groups, f"<= num_groups = {num_groups}",
                                           "keep at most every group"))
    if num_groups and e % num_groups:
        raise ContractError(format_problem(op, "num_groups", num_groups, f"a divisor of the expert count {e}",
                                           "split the experts into equal groups"))
    allowed = e if not num_groups else num_topk_groups * (e // num_groups)
    _check_int(op, "num_topk", num_topk, 1, allowed, f"choose at most the {allowed} experts of the kept groups")
    _check_bool(op, "use_shared_as_routed", use_shared_as_routed)
    if use_shared_as_routed:
        raise ContractError(format_problem(op, "use_shared_as_routed", "True", "False (shared experts routed as "
                                           "extra top-k slots are not in this contract)",
                                           "run the shared experts separately and add their output"))
    _check_int(op, "num_shared_experts", num_shared_experts, 0)
    _check_int(op, "num_ep_ranks", num_ep_ranks, 1)
    _check_int(op, "ep_rank", ep_rank, 0, num_ep_ranks - 1)
    _check_int(op, "num_tp_ranks", num_tp_ranks, 1, 1, "pass num_tp_ranks=1; mask expert ids per TP rank afterwards")
    _check_int(op, "tp_rank", tp_rank, 0, 0)
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)) \
            or not math.isfinite(routed_scaling_factor):
        raise ContractError(format_problem(op, "routed_scaling_factor", repr(routed_scaling_factor), "a finite float",
                                           "pass e.g. 2.5 (DeepSeek-V3)"))
    if scoring_func not in SCORING_FUNCS:
        raise ContractError(format_problem(op, "scoring_func", repr(scoring_func), f"one of {SCORING_FUNCS}",
                                           "use 'sigmoid' (DeepSeek-V3)"))
    if mask is not None:
        _check_tensor(op, "mask", mask, (torch.bool,), (t,), device, f"pass a bool [{t}] tensor or None")
    _check_bool(op, "normalize", normalize)
    _check_finite(op, "logits", logits)
    if bias is not None:
        _check_finite(op, "bias", bias)
    call = bind(TOP2_SUM_GATE, {}, [logits, bias, mask])
    return call.run(logits=logits, bias=bias, num_topk=num_topk, num_topk_groups=num_topk_groups,
                    num_groups=num_groups, routed_scaling_factor=float(routed_scaling_factor),
                    scoring_func=scoring_func, normalize=normalize, mask=mask)


@public_op(NORMALIZE_WEIGHT)
def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's weights divided by their sum (TileKernels `normalize_weight`).

    topk_weights: fp32 [T, k]. Returns (denominator fp32 [T] = Σ + 1e-20, normalized fp32 [T, k]).
    NaN/Inf are not checked: they propagate into their token's row.
    """
    op = NORMALIZE_WEIGHT.name
    _check_tensor(op, "topk_weights", topk_weights, (torch.float32,), (None, None), None,
                  "pass fp32 [num_tokens, num_topk] weights")
    call = bind(NORMALIZE_WEIGHT, {}, [topk_weights])
    return call.run(topk_weights=topk_weights)


@public_op(GET_FUSED_MAPPING)
def get_fused_mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int = 0,
                      alignment: int | None = None, force_no_sync: bool = False) -> FusedMapping:
    """Map (token, slot) pairs to rows of the expert-major fused buffer (TileKernels `get_fused_mapping`).

    topk_idx: int64 or int32 [T, k], values < num_experts; negative values are padding (map to -1)
    num_expanded_tokens: rows P of the buffer; 0 sizes it exactly (a host sync; num_tokens_per_expert_list
        is filled), unless force_no_sync, which uses the upper bound align(T·k + (alignment-1)·E, alignment)
        without syncing; a positive value must hold every aligned segment (extra rows are padding)
    alignment: rows each expert segment is padded to; None takes the backend's grouped-GEMM alignment
        (128 on NVIDIA, 256 on Ascend)
    Returns a FusedMapping (unpacks as TileKernels' 8-tuple; see its docstring).
    """
    op = GET_FUSED_MAPPING.name
    _check_tensor(op, "topk_idx", topk_idx, INDEX_DTYPES, (None, None), None,
                  "pass expert ids as int64 [num_tokens, num_topk] (-1 for padding)")
    _check_int(op, "num_experts", num_experts, 1)
    _check_int(op, "num_expanded_tokens", num_expanded_tokens, 0)
    if alignment is not None:
        _check_int(op, "alignment", alignment, 1, fix="pass e.g. 128, or None for the backend's alignment")
    _check_bool(op, "force_no_sync", force_no_sync)
    too_big = topk_idx >= num_experts
    if bool(too_big.any()):
        raise ContractError(format_problem(op, "topk_idx", f"naming experts >= num_experts ({_first_bad(too_big)})",
                                           f"values < num_experts = {num_experts} (negative = padding)",
                                           "pass the total expert count, or mask foreign experts with -1"))
    call = bind(GET_FUSED_MAPPING, {}, [topk_idx])
    align_rows = alignment if alignment is not None else call.selection.backend.moe_alignment
    t, k = topk_idx.shape
    synced = num_expanded_tokens == 0 and not force_no_sync
    counts = torch.bincount(topk_idx[topk_idx >= 0].to(torch.int64), minlength=num_experts)
    needed = int(aligned_counts(counts, align_rows).sum())
    if num_expanded_tokens == 0:
        rows = needed if synced else cdiv(t * k + (align_rows - 1) * num_experts, align_rows) * align_rows
    else:
        rows = num_expanded_tokens
        if rows < needed:
            raise ContractError(format_problem(op, "num_expanded_tokens", rows, f">= {needed} (the aligned "
                                               f"segments of these expert counts)",
                                               "pass 0 to size the buffer exactly, or a larger bound"))
    out = call.run(topk_idx=topk_idx, num_experts=num_experts, num_expanded_tokens=rows, alignment=align_rows)
    listed = [int(v) for v in out[6].tolist()] if synced else []
    return FusedMapping(*out, listed)


def _run_expand(contract: OpContract, x: torch.Tensor, x_sf: torch.Tensor | None, token_topk_to_pos: torch.Tensor,
                pos_to_expert: torch.Tensor, col_major_sf: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    op = contract.name
    t = x.shape[0]
    _check_tensor(op, "token_topk_to_pos", token_topk_to_pos, INDEX_DTYPES, (t, None), x.device,
                  f"pass the [num_tokens = {t}, num_topk] mapping from get_fused_mapping")
    _check_tensor(op, "pos_to_expert", pos_to_expert, INDEX_DTYPES, (None,), x.device,
                  "pass pos_to_expert [P] from get_fused_mapping")
    _check_expand_mapping(op, token_topk_to_pos, pos_to_expert)
    rows = pos_to_expert.numel()
    out = torch.empty(rows, x.shape[1], dtype=x.dtype, device=x.device)
    out_sf = None
    if x_sf is not None:
        s = x_sf.shape[1]
        if col_major_sf:
            # TMA-aligned MN-major storage (stride (1, align(P, 4))), the same fp32 values as row-major
            padded = cdiv(rows, 4) * 4
            out_sf = torch.empty(s, padded, dtype=x_sf.dtype, device=x.device)[:, :rows].T
        else:
            out_sf = torch.empty(rows, s, dtype=x_sf.dtype, device=x.device)
    call = bind(contract, {}, [x, x_sf, token_topk_to_pos, pos_to_expert])
    call.run(x=x, x_sf=x_sf, token_topk_to_pos=token_topk_to_pos, pos_to_expert=pos_to_expert, out=out,
             out_sf=out_sf)
    return out, out_sf


@public_op(EXPAND_TO_FUSED)
def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor | FusedMapping,
                    pos_to_expert: torch.Tensor | None = None) -> torch.Tensor:
    """Copy each token into its rows of the expert-major layout (TileKernels `expand_to_fused`).

    x: [T, H] of any dtype (copied bit for bit); token_topk_to_pos: int32 [T, k] (or a FusedMapping,
    then pos_to_expert is taken from it); pos_to_expert: int32 [P]. Returns [P, H] of x's dtype with
    padding rows (pos_to_expert < 0) zero.
    """
    op = EXPAND_TO_FUSED.name
    ttp, pte = _unpack_mapping(op, token_topk_to_pos, pos_to_expert, need_pos_to_expert=True)
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.element_size() not in _SAME_WIDTH_INT:
        raise ContractError(format_problem(op, "x", describe(x), "a 2-D tensor [num_tokens, hidden]",
                                           "pass token activations [T, H]; for FP8 with scales use "
                                           "expand_to_fused_with_sf"))
    return _run_expand(EXPAND_TO_FUSED, x, None, ttp, pte, False)[0]


@public_op(EXPAND_TO_FUSED_WITH_SF)
def expand_to_fused_with_sf(x: Any, num_per_channels: int, token_topk_to_pos: torch.Tensor | FusedMapping,
                            pos_to_expert: torch.Tensor | None = None,
                            use_tma_aligned_col_major_sf: bool = False) -> QuantTensor:
    """Copy FP8 tokens and their per-token scales into the expert-major layout (TileKernels
    `expand_to_fused_with_sf`).

    x: (fp8 [T, H], fp32 [T, ceil(H/num_per_channels)]) — a tuple or QuantTensor with granularity
       (1, num_per_channels); scales are the logical fp32 ones (not a backend's packed words)
    token_topk_to_pos / pos_to_expert: as in expand_to_fused
    use_tma_aligned_col_major_sf: store the output scales MN-major with the row count padded to 4
       (strides (1, align(P, 4))); the values are the same either way
    Returns a QuantTensor(fp8 [P, H], fp32 [P, S]) that unpacks as (out, out_sf); padding rows are 0.
    """
    op = EXPAND_TO_FUSED_WITH_SF.name
    ttp, pte = _unpack_mapping(op, token_topk_to_pos, pos_to_expert, need_pos_to_expert=True)
    _check_int(op, "num_per_channels", num_per_channels, 1, fix="pass the scale block size, e.g. 128")
    if isinstance(x, PreparedTensor):
        raise ContractError(format_problem(op, "x", describe(x), "logical (fp8 data, fp32 scales)",
                                           "pass the quantizer's QuantTensor, not a backend-prepared operand"))
    if isinstance(x, QuantTensor) and x.granularity != (1, num_per_channels):
        raise ContractError(format_problem(op, "x", f"scaled with granularity {x.granularity}",
                                           f"(1, num_per_channels) = (1, {num_per_channels})",
                                           "pass num_per_channels equal to the quantizer's gran_k"))
    if not (isinstance(x, (tuple, list, QuantTensor)) and len(tuple(x)) == 2):
        raise ContractError(format_problem(op, "x", describe(x), "a (fp8 data, fp32 scales) pair",
                                           "quantize with per_token_cast_to_fp8 first"))
    data, sf = tuple(x)
    _check_tensor(op, "x", data, (FP8_DTYPE,), (None, None), None, "pass fp8 e4m3 data [T, H]")
    t, h = data.shape
    s = cdiv(h, num_per_channels)
    _check_tensor(op, "x", sf, (torch.float32,), (t, s), data.device,
                  f"pass fp32 scales [T, ceil(H/{num_per_channels})] = [{t}, {s}] (logical, not packed)")
    _check_bool(op, "use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf)
    out, out_sf = _run_expand(EXPAND_TO_FUSED_WITH_SF, data, sf, ttp, pte, use_tma_aligned_col_major_sf)
    ue8m0 = x.ue8m0 if isinstance(x, QuantTensor) else False
    return QuantTensor(out, out_sf, (1, num_per_channels), ue8m0=ue8m0)


@public_op(REDUCE_FUSED)
def reduce_fused(x: Any, topk_weights: torch.Tensor | None, token_topk_to_pos: torch.Tensor | FusedMapping,
                 fp8_format: str = "", sf: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted sum of each token's expert rows back to token order (TileKernels `reduce_fused`).

    x: bf16/fp32 [P, H], or a pair (x, x_sf fp32 [P]) whose per-row scales multiply the rows
    topk_weights: None (plain sum) or fp32 [T, k]
    token_topk_to_pos: int32 [T, k] (or a FusedMapping); negative slots contribute nothing, and rows no
        slot points to (padding) are never read
    fp8_format: "" (output in x's dtype) or "e4m3" (output fp8: the fp32 sum times sf, clamped to ±448)
    sf: None or fp32 [1], only with fp8_format "e4m3"
    out: None or a contiguous [T, H] tensor of the output dtype to write into
    Accumulates in fp32; returns the output [T, H].
    """
    op = REDUCE_FUSED.name
    ttp, _ = _unpack_mapping(op, token_topk_to_pos, None, need_pos_to_expert=False)
    x_sf = None
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ContractError(format_problem(op, "x", describe(tuple(x)), "a tensor or an (x, x_sf) pair",
                                               "pass the expert outputs, optionally with per-row scales"))
        x, x_sf = x
    _check_tensor(op, "x", x, REDUCE_DTYPES, (None, None), None, "pass expert outputs as bf16/fp32 [P, H]")
    rows, h = x.shape
    device = x.device
    if x_sf is not None:
        _check_tensor(op, "x_sf", x_sf, (torch.float32,), (rows,), device, f"pass fp32 per-row scales [{rows}]")
    _check_tensor(op, "token_topk_to_pos", ttp, INDEX_DTYPES, (None, None), device,
                  "pass token_topk_to_pos [T, k] from get_fused_mapping")
    t, k = ttp.shape
    if topk_weights is not None:
        _check_tensor(op, "topk_weights", topk_weights, (torch.float32,), (t, k), device,
                      f"pass fp32 [{t}, {k}] weights (or None for a plain sum)")
    if fp8_format not in FP8_FORMATS:
        raise ContractError(format_problem(op, "fp8_format", repr(fp8_format), f"one of {FP8_FORMATS}",
                                           "pass '' for output in x's dtype or 'e4m3' for FP8"))
    fp8 = fp8_format == "e4m3"
    if sf is not None:
        if not fp8:
            raise ContractError(format_problem(op, "sf", describe(sf), "None unless fp8_format='e4m3'",
                                               "drop sf, or ask for FP8 output"))
        _check_tensor(op, "sf", sf, (torch.float32,), (1,), device, "pass an fp32 [1] output scale")
    out_dtype = FP8_DTYPE if fp8 else x.dtype
    if out is None:
        out = torch.empty(t, h, dtype=out_dtype, device=device)
    else:
        _check_tensor(op, "out", out, (out_dtype,), (t, h), device, f"allocate out as {out_dtype} [{t}, {h}]")
        if not out.is_contiguous():
            raise ContractError(format_problem(op, "out", f"non-contiguous (strides {out.stride()})", "contiguous",
                                               "pass a contiguous buffer"))
    _check_positions(op, ttp, rows)
    call = bind(REDUCE_FUSED, {}, [x, x_sf, topk_weights, ttp, sf, out])
    call.run(x=x, x_sf=x_sf, topk_weights=topk_weights, token_topk_to_pos=ttp, sf=sf, fp8=fp8, out=out)
    return out
