"""The DeepSeek-V3 grouped top-k gate (`top2_sum_gate`, contract stated in the package docstring) and
`normalize_weight`: constants, references, contracts and public ops.

The gate op itself ranks and weighs logical experts (scoring, groups, fixed routing, mask);
the public `top2_sum_gate` then applies TileKernels' routing steps as ops of their own: shared
expert slots, `map_to_physical_experts`, `mask_indices_by_tp`."""

from __future__ import annotations

import math

import attrs
import torch
import torch.nn.functional as F

from ...core.checks import check_bool, check_finite, check_int, check_tensor
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.providers import Inputs
from . import gate_checks
from .indices import map_to_physical_experts, mask_indices_by_tp
from .select import stable_topk, topk_sum_and_topk_group_idx_reference

#: scoring functions of the gate (TileKernels names)
SCORING_FUNCS = ("sigmoid", "sqrtsoftplus", "softmax")
#: a group's score is the sum of its best GROUP_SCORE_TOPK biased expert scores (DeepSeek-V3)
GROUP_SCORE_TOPK = 2
#: added to the weight sum before dividing (TileKernels' normalizer)
NORMALIZE_EPS = 1e-20
_FINITE_FIX = "find where {} became NaN/Inf upstream; the gate cannot rank them"


# ---------------------------------------------------------------------------------------------
# reference math


def score_reference(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    """Expert scores in fp32 [T, E] (softmax over each token's experts)."""
    x = logits.float()
    if scoring_func == "sigmoid":
        return torch.sigmoid(x)
    if scoring_func == "softmax":
        return torch.softmax(x, dim=-1)
    return F.softplus(x).sqrt()


def ranking_reference(logits: torch.Tensor, scores: torch.Tensor, bias: torch.Tensor | None,
                      scoring_func: str) -> torch.Tensor:
    """What experts are ranked by: the scores plus the bias — for softmax the logits plus the bias
    (TileKernels: softmax is monotonic, so it ranks the raw logits)."""
    base = logits.float() if scoring_func == "softmax" else scores
    return base if bias is None else base + bias.float()


def top2_sum_gate_reference(logits: torch.Tensor, bias: torch.Tensor | None, num_topk: int, num_topk_groups: int,
                            num_groups: int, routed_scaling_factor: float = 1.0, scoring_func: str = "sigmoid",
                            normalize: bool = True, mask: torch.Tensor | None = None,
                            fixed_topk_idx: torch.Tensor | None = None,
                            fix_routing_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference gate: logits fp32 [T, E] -> (topk_idx int64 [T, k], topk_weights fp32 [T, k]).

    Tokens with fix_routing_mask True keep the experts fixed_topk_idx names (their weights are still
    computed from this call's scores)."""
    scores = score_reference(logits, scoring_func)
    ranked = ranking_reference(logits, scores, bias, scoring_func)
    t, e = scores.shape
    if num_groups and num_topk_groups < num_groups:
        per_group = e // num_groups
        kept = topk_sum_and_topk_group_idx_reference(ranked.view(t, num_groups, per_group),
                                                     min(GROUP_SCORE_TOPK, per_group), num_topk_groups)
        keep = torch.zeros(t, num_groups, dtype=torch.bool, device=logits.device).scatter_(1, kept, True)
        ranked = ranked.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
    idx = stable_topk(ranked, num_topk)
    if fix_routing_mask is not None:
        idx = torch.where(fix_routing_mask[:, None], fixed_topk_idx.to(torch.int64), idx)
    weights = scores.gather(1, idx)
    if normalize:
        weights = weights / (weights.sum(-1, keepdim=True) + NORMALIZE_EPS)
    weights = weights * routed_scaling_factor
    if mask is not None:
        idx = idx.masked_fill(~mask[:, None], -1)
        weights = weights.masked_fill(~mask[:, None], 0.0)
    return idx, weights


def normalize_weight_reference(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(denominator fp32 [T] = 1e-20 + w_0 + w_1 + ..., normalized fp32 [T, k] = weights / denominator).

    The fp32 sum starts from the 1e-20 and adds the weights one by one in slot order (TileKernels'
    order, a rounding per addition), so the bytes are TileKernels'."""
    weights = topk_weights.float()
    denominator = torch.full(weights.shape[:1], NORMALIZE_EPS, dtype=torch.float32, device=weights.device)
    for slot in range(weights.shape[1]):
        denominator = denominator + weights[:, slot]
    return denominator, weights / denominator[:, None]


@attrs.frozen
class GateInputs(Inputs):
    """One top2_sum_gate call (validated): logits fp32 [T, E], bias None or fp32 [E], mask None or bool
    [T]; fix_routing_mask None or bool [T] with fixed_topk_idx int64 [T, k] (fields added with the
    TileKernels port, default None: a provider must honour them or decline)."""

    logits: torch.Tensor
    bias: torch.Tensor | None
    num_topk: int
    num_topk_groups: int
    num_groups: int
    routed_scaling_factor: float
    scoring_func: str
    normalize: bool
    mask: torch.Tensor | None
    #: int64 [T, k] experts of the tokens fix_routing_mask selects (rows elsewhere are not read)
    fixed_topk_idx: torch.Tensor | None = None
    fix_routing_mask: torch.Tensor | None = None
    device_field = "logits"

    def dims(self) -> dict[str, int]:
        t, e = self.logits.shape
        return {"T": t, "E": e, "k": self.num_topk, "groups": self.num_groups}


@attrs.frozen
class NormalizeInputs(Inputs):
    """One normalize_weight call: topk_weights fp32 [T, k]."""

    topk_weights: torch.Tensor
    device_field = "topk_weights"


def top2_sum_gate_kernel(call: GateInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference kernel of top2_sum_gate: returns (topk_idx, topk_weights)."""
    return top2_sum_gate_reference(call.logits, call.bias, call.num_topk, call.num_topk_groups, call.num_groups,
                                   call.routed_scaling_factor, call.scoring_func, call.normalize, call.mask,
                                   call.fixed_topk_idx, call.fix_routing_mask)


def normalize_weight_kernel(call: NormalizeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference kernel of normalize_weight."""
    return normalize_weight_reference(call.topk_weights)


TOP2_SUM_GATE = register_contract(OpContract("top2_sum_gate", top2_sum_gate_reference, Tolerance(dequantized=1e-9),
                                             kernel=top2_sum_gate_kernel))
NORMALIZE_WEIGHT = register_contract(OpContract("normalize_weight", normalize_weight_reference,
                                                Tolerance(dequantized=1e-10), kernel=normalize_weight_kernel))


# ---------------------------------------------------------------------------------------------
# public ops


@public_op(TOP2_SUM_GATE)
def top2_sum_gate(logits: torch.Tensor, bias: torch.Tensor | None, num_topk: int, num_topk_groups: int,
                  num_groups: int, use_shared_as_routed: bool = False, num_shared_experts: int = 0,
                  routed_scaling_factor: float = 1.0, ep_rank: int = 0, num_ep_ranks: int = 1, tp_rank: int = 0,
                  num_tp_ranks: int = 1, scoring_func: str = "sigmoid", mask: torch.Tensor | None = None,
                  fix_routing_mask: torch.Tensor | None = None, to_physical_map: torch.Tensor | None = None,
                  logical_count: torch.Tensor | None = None, unmapped_topk_idx: torch.Tensor | None = None, *,
                  normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 grouped top-k gate (TileKernels `top2_sum_gate`, same arguments); see the package docstring.

    logits: fp32 [T, E], finite; bias: None or fp32 [E], finite (ranking only)
    num_topk: experts per token, 1 <= num_topk <= num_topk_groups · E / num_groups
    num_topk_groups, num_groups: groups kept / groups in all (E % num_groups == 0); both 0 (or equal): no grouping
    scoring_func: "sigmoid", "sqrtsoftplus" or "softmax" (softmax ranks logits + bias; its weights are
        the softmax over all E experts, renormalized over the chosen ones)
    routed_scaling_factor: multiplies the weights; normalize (keyword): divide them by their sum (+1e-20) first
    mask: None or bool [T]; tokens with False get topk_idx -1 and weight 0 in every slot
    fix_routing_mask: None or bool [T]; tokens with True keep the experts already in unmapped_topk_idx
    unmapped_topk_idx: None or int64 [T, num_topk] (last dim contiguous); receives the chosen logical
        experts (-1 for masked tokens); with fix_routing_mask it is also read first
    use_shared_as_routed, num_shared_experts: append num_shared_experts slots naming the shared
        experts E .. E+S-1 with weight 1 (needs to_physical_map with at least S + 1 columns)
    to_physical_map, logical_count: int32 [E + S, D] and [E + S]: every slot's logical expert is replaced
        by a replica (map_to_physical_experts with ep_rank; D - 1 extra physical experts exist)
    num_tp_ranks > 1: keep only tp_rank's experts, renumbered (mask_indices_by_tp over n = E + D - 1
        experts on num_ep_ranks ranks); the weights are unchanged
    Returns (topk_idx int64 [T, num_topk + S], best first; topk_weights fp32 [T, num_topk + S]).
    """
    if is_compiling():
        return compiled_call("top2_sum_gate", logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
                             num_shared_experts, routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks,
                             scoring_func, mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx,
                             normalize=normalize)
    op = TOP2_SUM_GATE.name
    _check_gate_args(op, logits, bias, num_topk, num_topk_groups, num_groups, routed_scaling_factor, scoring_func,
                     mask, normalize)
    t, e = logits.shape
    extra = gate_checks.check_routing_args(
        op, t, e, num_topk, use_shared_as_routed, num_shared_experts, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks,
        fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx, mask, logits.device)
    fixed = unmapped_topk_idx if fix_routing_mask is not None else None
    idx, weights = run(TOP2_SUM_GATE, GateInputs(logits, bias, num_topk, num_topk_groups, num_groups,
                                                 float(routed_scaling_factor), scoring_func, normalize, mask,
                                                 fixed, fix_routing_mask))
    if unmapped_topk_idx is not None:
        unmapped_topk_idx.copy_(idx)
    if use_shared_as_routed:
        idx, weights = gate_checks.append_shared_slots(idx, weights, e, num_shared_experts, mask)
    if to_physical_map is not None:
        idx = map_to_physical_experts(idx, to_physical_map, logical_count, ep_rank)
    if num_tp_ranks > 1:
        idx = mask_indices_by_tp(idx, e + extra, num_ep_ranks, tp_rank, num_tp_ranks)
    return idx, weights


def _check_gate_args(op: str, logits: torch.Tensor, bias: torch.Tensor | None, num_topk: int, num_topk_groups: int,
                     num_groups: int, routed_scaling_factor: float, scoring_func: str, mask: torch.Tensor | None,
                     normalize: bool) -> None:
    check_tensor(op, "logits", logits, (torch.float32,), (None, None), None,
                 "pass router logits as fp32 [num_tokens, num_experts] (logits.float())")
    t, e = logits.shape
    if e == 0:
        raise ContractError(format_problem(op, "logits", "with 0 experts", "at least one expert column",
                                           "pass [num_tokens, num_experts] logits"))
    device = logits.device
    if bias is not None:
        check_tensor(op, "bias", bias, (torch.float32,), (e,), device, f"pass fp32 [{e}] (one per expert) or None")
    check_int(op, "num_groups", num_groups, 0)
    check_int(op, "num_topk_groups", num_topk_groups, 0)
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
    check_int(op, "num_topk", num_topk, 1, allowed, f"choose at most the {allowed} experts of the kept groups")
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)) \
            or not math.isfinite(routed_scaling_factor):
        raise ContractError(format_problem(op, "routed_scaling_factor", repr(routed_scaling_factor), "a finite float",
                                           "pass e.g. 2.5 (DeepSeek-V3)"))
    if scoring_func not in SCORING_FUNCS:
        raise ContractError(format_problem(op, "scoring_func", repr(scoring_func), f"one of {SCORING_FUNCS}",
                                           "use 'sigmoid' (DeepSeek-V3)"))
    if mask is not None:
        check_tensor(op, "mask", mask, (torch.bool,), (t,), device, f"pass a bool [{t}] tensor or None")
    check_bool(op, "normalize", normalize)
    check_finite(op, "logits", logits, _FINITE_FIX.format("logits"))
    if bias is not None:
        check_finite(op, "bias", bias, _FINITE_FIX.format("bias"))


@public_op(NORMALIZE_WEIGHT)
def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's weights divided by their sum (TileKernels `normalize_weight`).

    topk_weights: fp32 [T, k]. Returns (denominator fp32 [T] = 1e-20 + w_0 + w_1 + ... summed in that order,
    normalized fp32 [T, k]).
    NaN/Inf are not checked: they propagate into their token's row.
    """
    if is_compiling():
        return compiled_call("normalize_weight", topk_weights)
    op = NORMALIZE_WEIGHT.name
    check_tensor(op, "topk_weights", topk_weights, (torch.float32,), (None, None), None,
                  "pass fp32 [num_tokens, num_topk] weights")
    return run(NORMALIZE_WEIGHT, NormalizeInputs(topk_weights))
