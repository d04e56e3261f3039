"""The fused expert-major mapping (`get_fused_mapping`, `FusedMapping`): reference, contract and public
op, plus the checks a mapping passes when it is handed back to expand / reduce."""

from __future__ import annotations

from typing import Any, NamedTuple

import attrs
import torch

from ...core.checks import check_allocation, check_bool, check_int, check_tensor, first_bad
from ...core.compiled import compiled_call, is_compiling
from ...core.alignment import contiguous_alignment
from ...core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ...core.dispatch import run, selection_for
from ...core.errors import ContractError, format_problem
from ...layouts import aligned_counts, contiguous_m_indices, segment_starts
from ...core.providers import Inputs
from ...core.tensors import cdiv, describe

MAPPING_DTYPE = torch.int32
INDEX_DTYPES = (torch.int32, torch.int64)


# ---------------------------------------------------------------------------------------------
# reference math


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


@attrs.frozen
class FusedMappingInputs(Inputs):
    """One get_fused_mapping call (validated): topk_idx [T, k], the buffer's rows P and the alignment."""

    topk_idx: torch.Tensor
    num_experts: int
    num_expanded_tokens: int
    alignment: int
    device_field = "topk_idx"

    def dims(self) -> dict[str, int]:
        t, k = self.topk_idx.shape
        return {"T": t, "k": k, "E": self.num_experts, "P": self.num_expanded_tokens}


def get_fused_mapping_kernel(call: FusedMappingInputs) -> tuple[torch.Tensor, ...]:
    """Reference kernel of get_fused_mapping: the seven mapping tensors."""
    return fused_mapping_reference(call.topk_idx, call.num_experts, call.num_expanded_tokens, call.alignment)


GET_FUSED_MAPPING = register_contract(OpContract("get_fused_mapping", fused_mapping_reference,
                                                 Tolerance(dequantized=0.0), kernel=get_fused_mapping_kernel))


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
# validation of a mapping handed back to expand / reduce


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
                                           f"({first_bad(too_big)})", f"values < {num_rows} (negative = padding)",
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
                                           f"({first_bad(bad)}: rows hit twice, hit while padding, or never hit)",
                                           "each non-padding row targeted by exactly one (token, slot)",
                                           "pass token_topk_to_pos and pos_to_expert from the same get_fused_mapping"))


# ---------------------------------------------------------------------------------------------
# public ops


@public_op(GET_FUSED_MAPPING)
def get_fused_mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int = 0,
                      alignment: int | None = None, force_no_sync: bool = False) -> FusedMapping:
    """Map (token, slot) pairs to rows of the expert-major fused buffer (TileKernels `get_fused_mapping`).

    topk_idx: int64 or int32 [T, k], values < num_experts; negative values are padding (map to -1)
    num_expanded_tokens: rows P of the buffer; 0 sizes it exactly (a host sync; num_tokens_per_expert_list
        is filled), unless force_no_sync, which uses the upper bound align(T·k + (alignment-1)·E, alignment)
        without syncing; a positive value must hold every aligned segment (extra rows are padding)
    alignment: rows each expert segment is padded to; None takes the grouped GEMMs' contiguous
        alignment: set_mk_alignment_for_contiguous_layout's value, else the backend's (128 on NVIDIA,
        256 on Ascend)
    Returns a FusedMapping (unpacks as TileKernels' 8-tuple; see its docstring).
    """
    if is_compiling():
        return compiled_call("get_fused_mapping", topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync)
    op = GET_FUSED_MAPPING.name
    check_tensor(op, "topk_idx", topk_idx, INDEX_DTYPES, (None, None), None,
                  "pass expert ids as int64 [num_tokens, num_topk] (-1 for padding)")
    check_int(op, "num_experts", num_experts, 1)
    check_int(op, "num_expanded_tokens", num_expanded_tokens, 0)
    if alignment is not None:
        check_int(op, "alignment", alignment, 1, fix="pass e.g. 128, or None for the backend's alignment")
    check_bool(op, "force_no_sync", force_no_sync)
    t, k = topk_idx.shape
    # the mapping's three per-row int32 tensors; the expanded activations come on top of this
    check_allocation(op, "num_expanded_tokens", 3 * num_expanded_tokens, 4, topk_idx.device,
                     "pass 0 to size the buffer exactly, or the real upper bound of rows")
    if force_no_sync:  # no host read of topk_idx at all: the buffer is sized by the upper bound
        selection = selection_for(GET_FUSED_MAPPING, FusedMappingInputs(topk_idx, num_experts, 0, 1))
        align_rows = alignment if alignment is not None else contiguous_alignment(selection.backend)
        bound = cdiv(t * k + (align_rows - 1) * num_experts, align_rows) * align_rows
        rows, synced = num_expanded_tokens or bound, False
    else:
        too_big = topk_idx >= num_experts
        if bool(too_big.any()):
            raise ContractError(format_problem(op, "topk_idx", f"naming experts >= num_experts ({first_bad(too_big)})",
                                               f"values < num_experts = {num_experts} (negative = padding)",
                                               "pass the total expert count, or mask foreign experts with -1"))
        selection = selection_for(GET_FUSED_MAPPING, FusedMappingInputs(topk_idx, num_experts, 0, 1))
        align_rows = alignment if alignment is not None else contiguous_alignment(selection.backend)
        synced = num_expanded_tokens == 0
        counts = torch.bincount(topk_idx[topk_idx >= 0].to(torch.int64), minlength=num_experts)
        needed = int(aligned_counts(counts, align_rows).sum())
        rows = needed if synced else num_expanded_tokens
        if rows < needed:
            raise ContractError(format_problem(op, "num_expanded_tokens", rows, f">= {needed} (the aligned "
                                               f"segments of these expert counts)",
                                               "pass 0 to size the buffer exactly, or a larger bound"))
    out = run(GET_FUSED_MAPPING, FusedMappingInputs(topk_idx, num_experts, rows, align_rows))
    listed = [int(v) for v in out[6].tolist()] if synced else []
    return FusedMapping(*out, listed)
