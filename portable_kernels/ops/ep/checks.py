"""Argument validation of the expert-parallel ops: every check runs before anything is computed
and raises a ContractError that names the argument."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ...core.checks import check_bool, check_device, check_int, check_tensor
from ...core.contract import checks_values
from ...core.errors import ContractError, format_problem
from ...core.tensors import FP8_DTYPE, QuantTensor, describe
from .constants import SCALE_BLOCK, TOPK_IDX_DTYPES, WEIGHT_DTYPE, X_DTYPES
from .results import DispatchHandle


def _check_positive_int(op: str, arg: str, value: Any) -> int:
    check_int(op, arg, value, 1, fix=f"pass {arg} as a Python int >= 1")
    return value


_check_bool = check_bool


def _check_num_experts(op: str, num_experts: Any, num_ranks: int) -> int:
    _check_positive_int(op, "num_experts", num_experts)
    if num_experts % num_ranks:
        raise ContractError(format_problem(op, "num_experts", num_experts, f"a multiple of the {num_ranks} ranks",
                                           "give every rank the same number of experts (num_experts = R * L)"))
    return num_experts


def _check_per_rank(op: str, arg: str, value: Any, num_ranks: int | None = None) -> int:
    """A list or tuple with one entry per rank; returns R."""
    if not isinstance(value, (list, tuple)) or len(value) == 0:
        raise ContractError(format_problem(op, arg, describe(value), "a non-empty list with one entry per rank",
                                           f"pass [{arg.rstrip('s')} of rank 0, {arg.rstrip('s')} of rank 1, ...]"))
    if num_ranks is not None and len(value) != num_ranks:
        raise ContractError(format_problem(op, arg, f"a list of {len(value)} entries", f"{num_ranks} (one per rank)",
                                           "pass one entry per rank, in rank order"))
    return len(value)


def _check_device(op: str, arg: str, t: torch.Tensor, device: torch.device) -> None:
    check_device(op, arg, t, device, like="xs[0]")


def _check_tensor(op: str, arg: str, t: Any, dtypes: tuple[torch.dtype, ...], shape: tuple[int | None, ...],
                  device: torch.device | None, fix: str) -> torch.Tensor:
    """t is a tensor of one of `dtypes` whose shape matches `shape` (None matches any size); returns t."""
    check_tensor(op, arg, t, dtypes, shape, device, fix)
    return t


def _check_topk_idx(op: str, arg: str, idx: Any, num_experts: int, num_tokens: int | None, num_topk: int | None,
                    device: torch.device | None, values: bool = True) -> torch.Tensor:
    """values=False: dtype and shape only (the ids were checked already, e.g. by this Buffer's
    get_dispatch_layout on the same unchanged tensor)."""
    _check_tensor(op, arg, idx, TOPK_IDX_DTYPES, (num_tokens, num_topk), device,
                  "pass the router's expert ids, int64 [num_tokens, num_topk] (negative = no expert)")
    if idx.shape[1] == 0:
        raise ContractError(format_problem(op, arg, "of shape (T, 0)", "at least one top-k column",
                                           "pass num_topk >= 1 (mark unused entries with -1)"))
    if not values or idx.numel() == 0 or not checks_values(idx):
        return idx  # on an accelerator reading the ids would synchronize; see contract.checks_values
    top = int(idx.max())
    if top >= num_experts:
        raise ContractError(format_problem(op, arg, f"holding expert id {top}", f"ids < num_experts = {num_experts} "
                                           "(or negative for no expert)", "route only to existing experts"))
    ordered = idx.sort(dim=1).values
    duplicate = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    if bool(duplicate.any()):
        row = int(duplicate.any(dim=1).nonzero()[0])
        raise ContractError(format_problem(op, arg, f"choosing an expert twice in row {row} ({idx[row].tolist()})",
                                           "distinct expert ids per token (negative entries excepted)",
                                           "set repeated entries to -1"))
    return idx


def _check_weights(op: str, arg: str, w: Any, idx: torch.Tensor, device: torch.device) -> torch.Tensor:
    return _check_tensor(op, arg, w, (WEIGHT_DTYPE,), tuple(idx.shape), device,
                         "pass fp32 weights shaped like topk_idx")


def _check_fp8_pair(op: str, arg: str, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(x, QuantTensor):
        if x.element != "e4m3" or x.granularity != (1, SCALE_BLOCK):
            raise ContractError(format_problem(op, arg, repr(x), f"FP8 e4m3 tokens scaled per (1, {SCALE_BLOCK})",
                                               "quantize with per_token_cast_to_fp8(x)"))
        x = (x.data, x.scale)
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise ContractError(format_problem(op, arg, describe(x), "an FP8 pair (fp8 [T, H], fp32 [T, H/128]) like xs[0]",
                                           "send every rank's tokens in one form: all plain or all FP8 pairs"))
    data = _check_tensor(op, arg, x[0], (FP8_DTYPE,), (None, None), None, "pass x_fp8 as float8_e4m3fn [T, H]")
    if data.shape[1] % SCALE_BLOCK:
        raise ContractError(format_problem(op, arg, f"FP8 tokens with hidden {data.shape[1]}",
                                           f"hidden divisible by {SCALE_BLOCK}", "pad hidden to a multiple of 128"))
    scales = _check_tensor(op, arg, x[1], (torch.float32,), (data.shape[0], data.shape[1] // SCALE_BLOCK), None,
                           "pass the fp32 per-token scales [T, H/128] of the same cast")
    return data, scales


def _check_x(op: str, xs: Any, allow_fp8: bool) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    """Per-rank tokens: all plain [T_r, H] tensors or (allow_fp8) all FP8 (data, scales [T_r, H/128]) pairs,
    of one dtype and hidden size, on one device."""
    _check_per_rank(op, "xs", xs)
    fp8 = allow_fp8 and isinstance(xs[0], (tuple, list, QuantTensor))
    data, scales = [], []
    for r, x in enumerate(xs):
        if fp8:
            d, s = _check_fp8_pair(op, f"xs[{r}]", x)
            data.append(d)
            scales.append(s)
        else:
            data.append(_check_tensor(op, f"xs[{r}]", x, X_DTYPES, (None, None), None,
                                      "pass every rank's tokens as bf16 [num_tokens, hidden]"))
    first = data[0]
    for r, t in enumerate(data):
        arg = f"xs[{r}]"
        _check_device(op, arg, t, first.device)
        if scales:
            _check_device(op, arg, scales[r], first.device)
        if t.dtype != first.dtype or t.shape[1] != first.shape[1] or t.shape[1] == 0:
            raise ContractError(format_problem(op, arg, describe(t), f"{first.dtype} [*, {first.shape[1]}] like xs[0], "
                                               "hidden >= 1", "give every rank tokens of one dtype and hidden size"))
    return tuple(data), (tuple(scales) if fp8 else None)


def _check_topk_per_rank(op: str, topk_idx: Any, topk_weights: Any, sizes: Sequence[int | None],
                         device: torch.device, num_experts: int
                         ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    """Per-rank topk_idx [T_r, k] (one k for all ranks) and optional fp32 weights of the same shape."""
    num_ranks = len(sizes)
    _check_per_rank(op, "topk_idx", topk_idx, num_ranks)
    num_topk = topk_idx[0].shape[1] if isinstance(topk_idx[0], torch.Tensor) and topk_idx[0].dim() == 2 else None
    idx = tuple(_check_topk_idx(op, f"topk_idx[{r}]", topk_idx[r], num_experts, sizes[r], num_topk, device)
                for r in range(num_ranks))
    if topk_weights is None:
        return idx, None
    _check_per_rank(op, "topk_weights", topk_weights, num_ranks)
    weights = tuple(_check_weights(op, f"topk_weights[{r}]", topk_weights[r], idx[r], device) for r in range(num_ranks))
    return idx, weights


def _check_dispatch_handles(op: str, handles: Any, num_ranks: int, device: torch.device) -> tuple[DispatchHandle, ...]:
    _check_per_rank(op, "handles", handles, num_ranks)
    for r, h in enumerate(handles):
        arg = f"handles[{r}]"
        if not isinstance(h, DispatchHandle) or h.rank != r or h.num_ranks != num_ranks:
            raise ContractError(format_problem(op, arg, describe(h), f"the DispatchHandle of rank {r} of {num_ranks}",
                                               "pass the handles of one simulate_dispatch call, in rank order"))
        _check_device(op, arg, h.recv_src_idx, device)
        if not torch.equal(h.rank_prefix_matrix, handles[0].rank_prefix_matrix):
            raise ContractError(format_problem(op, arg, "from another dispatch than handles[0]",
                                               "handles of one dispatch",
                                               "pass the handles of one simulate_dispatch call"))
    return tuple(handles)


def check_finite_for_round_scale(op: str, arg: str, x: torch.Tensor) -> None:
    """Power-of-two scales need a finite amax per 128-channel block."""
    if checks_values(x) and x.numel() and not bool(torch.isfinite(x).all()):
        row = int((~torch.isfinite(x)).any(dim=1).nonzero()[0])
        raise ContractError(format_problem(op, arg, f"holding NaN or Inf (first in token {row})",
                                           "finite tokens with round_scale=True (a NaN/Inf block has no "
                                           "power-of-two scale)",
                                           "clean the tokens (torch.nan_to_num / clamp) or pass round_scale=False"))
