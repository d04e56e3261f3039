"""The DeepSeek-V3 grouped top-k gate (`top2_sum_gate`, contract stated in the package docstring) and
`normalize_weight`: constants, references, contracts and public ops."""

from __future__ import annotations

import math

import attrs
import torch
import torch.nn.functional as F

from ..checks import check_bool, check_finite, check_int, check_tensor
from ..contract import OpContract, Tolerance, public_op, register_contract
from ..dispatch import run
from ..errors import ContractError, format_problem
from ..providers import Inputs

#: scoring functions of the gate (TileKernels names); softmax is not in this contract
SCORING_FUNCS = ("sigmoid", "sqrtsoftplus")
#: a group's score is the sum of its best GROUP_SCORE_TOPK biased expert scores (DeepSeek-V3)
GROUP_SCORE_TOPK = 2
#: added to the weight sum before dividing (TileKernels' normalizer)
NORMALIZE_EPS = 1e-20
_FINITE_FIX = "find where {} became NaN/Inf upstream; the gate cannot rank them"


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


@attrs.frozen
class GateInputs(Inputs):
    """One top2_sum_gate call (validated): logits fp32 [T, E], bias None or fp32 [E], mask None or bool [T]."""

    logits: torch.Tensor
    bias: torch.Tensor | None
    num_topk: int
    num_topk_groups: int
    num_groups: int
    routed_scaling_factor: float
    scoring_func: str
    normalize: bool
    mask: torch.Tensor | None
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
                                   call.routed_scaling_factor, call.scoring_func, call.normalize, call.mask)


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
    check_bool(op, "use_shared_as_routed", use_shared_as_routed)
    if use_shared_as_routed:
        raise ContractError(format_problem(op, "use_shared_as_routed", "True", "False (shared experts routed as "
                                           "extra top-k slots are not in this contract)",
                                           "run the shared experts separately and add their output"))
    check_int(op, "num_shared_experts", num_shared_experts, 0)
    check_int(op, "num_ep_ranks", num_ep_ranks, 1)
    check_int(op, "ep_rank", ep_rank, 0, num_ep_ranks - 1)
    check_int(op, "num_tp_ranks", num_tp_ranks, 1, 1, "pass num_tp_ranks=1; mask expert ids per TP rank afterwards")
    check_int(op, "tp_rank", tp_rank, 0, 0)
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
    return run(TOP2_SUM_GATE, GateInputs(logits, bias, num_topk, num_topk_groups, num_groups,
                                         float(routed_scaling_factor), scoring_func, normalize, mask))


@public_op(NORMALIZE_WEIGHT)
def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's weights divided by their sum (TileKernels `normalize_weight`).

    topk_weights: fp32 [T, k]. Returns (denominator fp32 [T] = Σ + 1e-20, normalized fp32 [T, k]).
    NaN/Inf are not checked: they propagate into their token's row.
    """
    op = NORMALIZE_WEIGHT.name
    check_tensor(op, "topk_weights", topk_weights, (torch.float32,), (None, None), None,
                  "pass fp32 [num_tokens, num_topk] weights")
    return run(NORMALIZE_WEIGHT, NormalizeInputs(topk_weights))
