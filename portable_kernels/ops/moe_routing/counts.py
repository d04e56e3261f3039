"""Per-expert counts of a routing (TileKernels `group_count` and `aux_fi`): references, contracts
and public ops. Negative ids are padding and count nothing.

- `group_count(group_idx, num_groups)` -> int32 [G]: how many entries name each group (expert).
- `aux_fi(topk_idx, num_experts, num_aux_topk)` -> fp32 [E]: the auxiliary-loss frequency
  f_i = count_i · E / (T · num_aux_topk), T = rows of topk_idx, computed as one fp32 division of
  fp32(count_i · E) by fp32(T · num_aux_topk) (exact integers below 2^24); zeros when T = 0.
"""

from __future__ import annotations

import attrs
import torch

from ...core.checks import check_int, check_tensor, first_bad
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.providers import Inputs
from .mapping import INDEX_DTYPES


def group_count_reference(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """int32 [num_groups]: entries of group_idx equal to each group (negative entries ignored)."""
    ids = group_idx.reshape(-1).to(torch.int64)
    return torch.bincount(ids[ids >= 0], minlength=num_groups).to(torch.int32)


def aux_fi_reference(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """fp32 [E]: count · E / (T · num_aux_topk) as one fp32 division (zeros when T = 0)."""
    counts = group_count_reference(topk_idx, num_experts).to(torch.int64)
    t = topk_idx.shape[0]
    if t == 0:
        return torch.zeros(num_experts, dtype=torch.float32, device=topk_idx.device)
    numerator = (counts * num_experts).to(torch.float32)
    return numerator / torch.full_like(numerator, float(t * num_aux_topk))


@attrs.frozen
class CountInputs(Inputs):
    """One group_count / aux_fi call: ids [T, k] (negative = padding), the id range, and aux_fi's
    num_aux_topk (0 for group_count)."""

    idx: torch.Tensor
    num_groups: int
    num_aux_topk: int
    device_field = "idx"

    def dims(self) -> dict[str, int]:
        t, k = self.idx.shape
        return {"T": t, "k": k, "G": self.num_groups}


def group_count_kernel(call: CountInputs) -> torch.Tensor:
    """Reference kernel of group_count."""
    return group_count_reference(call.idx, call.num_groups)


def aux_fi_kernel(call: CountInputs) -> torch.Tensor:
    """Reference kernel of aux_fi."""
    return aux_fi_reference(call.idx, call.num_groups, call.num_aux_topk)


GROUP_COUNT = register_contract(OpContract("group_count", group_count_reference, Tolerance(dequantized=0.0),
                                           kernel=group_count_kernel))
AUX_FI = register_contract(OpContract("aux_fi", aux_fi_reference, Tolerance(dequantized=1e-12), kernel=aux_fi_kernel))


def _check_ids(op: str, arg: str, idx: torch.Tensor, limit: int, limit_name: str) -> None:
    check_tensor(op, arg, idx, INDEX_DTYPES, (None, None), None, "pass int64 ids [num_tokens, num_topk] (-1 = none)")
    if checks_values(idx) and idx.numel():
        too_big = idx >= limit
        if bool(too_big.any()):
            raise ContractError(format_problem(op, arg, f"naming ids >= {limit_name} ({first_bad(too_big)})",
                                               f"values < {limit_name} = {limit} (negative = padding)",
                                               f"pass the total count as {limit_name}, or mask foreign ids with -1"))


@public_op(GROUP_COUNT)
def group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """How many entries name each group (TileKernels `group_count`).

    group_idx: int64/int32 [T, k], values < num_groups, negative = padding. Returns int32 [num_groups].
    """
    if is_compiling():
        return compiled_call("group_count", group_idx, num_groups)
    op = GROUP_COUNT.name
    check_int(op, "num_groups", num_groups, 1)
    _check_ids(op, "group_idx", group_idx, num_groups, "num_groups")
    return run(GROUP_COUNT, CountInputs(group_idx, num_groups, 0))


@public_op(AUX_FI)
def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """The auxiliary-loss frequency indicator per expert (TileKernels `aux_fi`): see the module docstring.

    topk_idx: int64/int32 [T, k], values < num_experts, negative = padding; num_aux_topk >= 1.
    Returns fp32 [num_experts].
    """
    if is_compiling():
        return compiled_call("aux_fi", topk_idx, num_experts, num_aux_topk)
    op = AUX_FI.name
    check_int(op, "num_experts", num_experts, 1)
    check_int(op, "num_aux_topk", num_aux_topk, 1, fix="pass the top-k the auxiliary loss normalizes by")
    _check_ids(op, "topk_idx", topk_idx, num_experts, "num_experts")
    return run(AUX_FI, CountInputs(topk_idx, num_experts, num_aux_topk))
