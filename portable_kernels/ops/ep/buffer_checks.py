"""Argument checks of the distributed Buffer, on one rank, before its header leaves.

Each function checks one call's own arguments and raises ContractError naming the argument; the
Buffer catches it, tells the other ranks (header status) and re-raises, so every rank stops.
Value checks (index ranges, NaN, the consistency of DeepEP's redundant layout tensors) run where
`checks_values` allows (always on CPU tensors).
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.contract import checks_values
from ...core.errors import ContractError, format_problem
from ...core.tensors import describe
from .checks import (_check_bool, _check_fp8_pair, _check_num_experts, _check_positive_int, _check_tensor,
                     _check_topk_idx, check_finite_for_round_scale)
from .constants import SCALE_BLOCK, WEIGHT_DTYPE, X_DTYPES
from .dispatch_layout import get_dispatch_layout
from .events import EventOverlap
from .handle_checks import check_layout_ranges
from .results import DispatchHandle, LowLatencyHandle
from .sizes import Config

COUNT_DTYPES = (torch.int32, torch.int64)


def check_x(op: str, x: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x: bf16/fp16/fp32 [T, H] or an FP8 pair (fp8 [T, H], fp32 [T, H/128]) -> (data, scales | None)."""
    if isinstance(x, torch.Tensor):
        data = _check_tensor(op, "x", x, X_DTYPES, (None, None), None, "pass the tokens as bf16 [num_tokens, hidden]")
        if data.shape[1] == 0:
            raise ContractError(format_problem(op, "x", "of hidden 0", "hidden >= 1", "pass real token rows"))
        return data, None
    data, scales = _check_fp8_pair(op, "x", x)
    if scales.device != data.device:
        raise ContractError(format_problem(op, "x", f"scales on {scales.device}", f"on {data.device} like the data",
                                           "keep both halves of the FP8 pair on one device"))
    return data, scales


def check_flags(op: str, **flags: Any) -> None:
    for name, value in flags.items():
        _check_bool(op, name, value)


def check_event(op: str, previous_event: Any) -> None:
    if previous_event is not None and not isinstance(previous_event, EventOverlap):
        raise ContractError(format_problem(op, "previous_event", describe(previous_event), "None or an EventOverlap",
                                           "pass the event a Buffer call returned, or Buffer.capture()"))


def check_config(op: str, config: Any) -> None:
    if config is not None and not isinstance(config, Config):
        raise ContractError(format_problem(op, "config", describe(config), "None or a portable_kernels.ops.ep.Config",
                                           "pass Buffer.get_dispatch_config(num_ranks) or leave it None"))


def check_layout_inputs(op: str, num_tokens_per_rank: Any, is_token_in_rank: Any, num_tokens_per_expert: Any,
                        topk_idx: Any, num_tokens: int, num_ranks: int, device: torch.device,
                        values: bool = True) -> int:
    """DeepEP's non-cached dispatch layout tensors; returns num_experts (= num_tokens_per_expert.numel()).
    values=False: dtypes and shapes only (the tensors are those this Buffer's get_dispatch_layout
    returned for topk_idx, all unchanged since)."""
    for arg, value in (("num_tokens_per_rank", num_tokens_per_rank), ("is_token_in_rank", is_token_in_rank),
                       ("num_tokens_per_expert", num_tokens_per_expert)):
        if value is None:
            raise ContractError(format_problem(op, arg, "None", "the tensor Buffer.get_dispatch_layout returned",
                                               "pass the layout of topk_idx (or handle=... for a cached dispatch)"))
    _check_tensor(op, "num_tokens_per_rank", num_tokens_per_rank, COUNT_DTYPES, (num_ranks,), device,
                  f"pass int32 [{num_ranks}] from Buffer.get_dispatch_layout")
    _check_tensor(op, "is_token_in_rank", is_token_in_rank, (torch.bool,), (num_tokens, num_ranks), device,
                  f"pass bool [num_tokens, {num_ranks}] from Buffer.get_dispatch_layout")
    _check_tensor(op, "num_tokens_per_expert", num_tokens_per_expert, COUNT_DTYPES, (None,), device,
                  "pass int32 [num_experts] from Buffer.get_dispatch_layout")
    num_experts = num_tokens_per_expert.shape[0]
    if num_experts == 0 or num_experts % num_ranks:
        raise ContractError(format_problem(op, "num_tokens_per_expert", f"of length {num_experts}",
                                           f"num_experts, a positive multiple of the {num_ranks} ranks",
                                           "give every rank the same number of experts"))
    if not values or not checks_values(is_token_in_rank, num_tokens_per_rank, num_tokens_per_expert):
        return num_experts
    per_rank = is_token_in_rank.sum(dim=0)
    if not torch.equal(per_rank.long(), num_tokens_per_rank.long()):
        raise ContractError(format_problem(op, "num_tokens_per_rank", num_tokens_per_rank.tolist(),
                                           f"the column sums of is_token_in_rank, {per_rank.tolist()}",
                                           "pass the tensors of one get_dispatch_layout call"))
    if topk_idx is not None and checks_values(topk_idx):
        want_rank, _, want_expert, want_in = get_dispatch_layout(topk_idx, num_experts, num_ranks)
        if not torch.equal(want_in, is_token_in_rank):
            raise ContractError(format_problem(op, "is_token_in_rank", "not where topk_idx sends the tokens",
                                               "get_dispatch_layout(topk_idx, num_experts)[3]",
                                               "pass the layout of this topk_idx"))
        if not torch.equal(want_expert.long(), num_tokens_per_expert.long()):
            raise ContractError(format_problem(op, "num_tokens_per_expert", num_tokens_per_expert.tolist(),
                                               f"the counts of topk_idx, {want_expert.tolist()}",
                                               "pass the layout of this topk_idx"))
    return num_experts


def check_topk(op: str, topk_idx: Any, topk_weights: Any, num_experts: int, num_tokens: int,
               device: torch.device, values: bool = True) -> None:
    """topk_idx int64/int32 [T, k] (< num_experts, negative = none, distinct); weights fp32 [T, k] or None.
    values=False: the ids' dtype and shape only (see check_layout_inputs)."""
    _check_topk_idx(op, "topk_idx", topk_idx, num_experts, num_tokens, None, device, values)
    if topk_weights is not None:
        _check_tensor(op, "topk_weights", topk_weights, (WEIGHT_DTYPE,), tuple(topk_idx.shape), device,
                      "pass fp32 weights shaped like topk_idx")


def check_dispatch_handle(op: str, handle: Any, rank: int, num_ranks: int, num_tokens: int,
                          device: torch.device) -> DispatchHandle:
    if not isinstance(handle, DispatchHandle) or handle.rank != rank or handle.num_ranks != num_ranks:
        raise ContractError(format_problem(op, "handle", describe(handle),
                                           f"the handle this rank's ({rank} of {num_ranks}) dispatch returned",
                                           "pass the 5th value Buffer.dispatch returned on this rank"))
    if handle.num_tokens != num_tokens:
        raise ContractError(format_problem(op, "x", f"holding {num_tokens} tokens",
                                           f"{handle.num_tokens} tokens like the dispatch of this handle",
                                           "a cached dispatch moves new rows of the same tokens along the same layout"))
    if handle.recv_src_idx.device != device:
        raise ContractError(format_problem(op, "handle", f"on {handle.recv_src_idx.device}", f"on {device} like x",
                                           "keep the handle on the tokens' device"))
    return handle


def check_combine_args(op: str, x: Any, handle: DispatchHandle, topk_weights: Any,
                       bias: Any) -> tuple[torch.Tensor, ...]:
    """x [N or num_worst_tokens, H], fp32 weights [same rows, k] or None, bias: None, [T, H] or a pair."""
    rows = handle.num_worst_tokens or handle.recv_src_idx.shape[0]
    device = handle.recv_src_idx.device
    _check_tensor(op, "x", x, X_DTYPES, (rows, None), device,
                  f"return one bf16 row per received row ({rows}) in the order dispatch returned them")
    if topk_weights is not None:
        _check_tensor(op, "topk_weights", topk_weights, (WEIGHT_DTYPE,), (rows, None), device,
                      "pass the fp32 recv_topk_weights of the dispatch")
    biases: tuple[Any, ...] = () if bias is None else (bias,) if isinstance(bias, torch.Tensor) else tuple(bias)
    if len(biases) > 2:
        raise ContractError(format_problem(op, "bias", f"{len(biases)} tensors", "None, one tensor or a pair",
                                           "pass at most two bias tensors"))
    for i, b in enumerate(biases):
        _check_tensor(op, f"bias[{i}]", b, (x.dtype,), (handle.num_tokens, x.shape[1]), device,
                      f"pass {x.dtype} [num_tokens, hidden] biases")
    return biases


def check_low_latency_x(op: str, x: Any, num_max_dispatch_tokens_per_rank: Any, use_fp8: bool) -> torch.Tensor:
    data = _check_tensor(op, "x", x, X_DTYPES, (None, None), None, "pass the tokens as bf16 [num_tokens, hidden]")
    max_tokens = _check_positive_int(op, "num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank)
    if data.shape[0] > max_tokens:
        raise ContractError(format_problem(op, "x", f"holding {data.shape[0]} tokens",
                                           f"at most num_max_dispatch_tokens_per_rank = {max_tokens}",
                                           "raise num_max_dispatch_tokens_per_rank (same on every rank) or send "
                                           "fewer tokens"))
    if data.shape[1] == 0 or (use_fp8 and data.shape[1] % SCALE_BLOCK):
        raise ContractError(format_problem(op, "x", f"of hidden {data.shape[1]}",
                                           f"hidden >= 1, divisible by {SCALE_BLOCK} with use_fp8",
                                           "pad hidden to a multiple of 128 or pass use_fp8=False"))
    return data


def check_low_latency_handle(op: str, handle: Any, num_ranks: int) -> LowLatencyHandle:
    """A LowLatencyHandle whose ranges tile each expert's valid slots and whose valid slots name
    tokens below num_max_dispatch_tokens_per_rank."""
    if not isinstance(handle, LowLatencyHandle):
        raise ContractError(format_problem(op, "handle", describe(handle), "the LowLatencyHandle of this rank's "
                                           "low_latency_dispatch", "pass the 3rd value low_latency_dispatch returned"))
    experts, max_tokens = handle.num_experts, handle.num_max_dispatch_tokens_per_rank
    if experts % num_ranks:
        raise ContractError(format_problem(op, "handle", f"for {experts} experts", f"a multiple of {num_ranks} ranks",
                                           "pass a handle of this Buffer's group"))
    per_rank, slots = experts // num_ranks, max_tokens * num_ranks
    _check_tensor(op, "handle", handle.recv_src_info, (torch.int32,), (per_rank, slots), None,
                  "pass the handle low_latency_dispatch returned (recv_src_info int32 [L, M*R])")
    _check_tensor(op, "handle", handle.recv_layout_range, (torch.int64,), (per_rank, num_ranks),
                  handle.recv_src_info.device, "pass the handle low_latency_dispatch returned (int64 [L, R])")
    check_layout_ranges(op, "handle", handle)
    return handle


def check_count_dtype(op: str, arg: str, t: Any, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...],
                      device: torch.device) -> None:
    if t is not None:
        _check_tensor(op, arg, t, dtypes, shape, device, f"pass {dtypes[0]} {list(shape)} or None")


def check_low_latency_dispatch_args(op: str, x: Any, topk_idx: Any, num_max_dispatch_tokens_per_rank: Any,
                                    num_experts: Any, num_ranks: int, stats: Any, wait_stats: Any, use_fp8: Any,
                                    round_scale: Any, use_ue8m0: Any, async_finish: Any, return_recv_hook: Any,
                                    prepare_for: Any) -> None:
    check_flags(op, use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=use_ue8m0, async_finish=async_finish,
                return_recv_hook=return_recv_hook)
    data = check_low_latency_x(op, x, num_max_dispatch_tokens_per_rank, use_fp8)
    experts = _check_num_experts(op, num_experts, num_ranks)
    _check_topk_idx(op, "topk_idx", topk_idx, experts, data.shape[0], None, data.device)
    if use_ue8m0 and not round_scale:
        raise ContractError(format_problem(op, "use_ue8m0", True, "use_ue8m0 only with round_scale=True",
                                           "pass round_scale=True too (UE8M0 holds powers of two only)"))
    if (round_scale or use_ue8m0) and not use_fp8:
        raise ContractError(format_problem(op, "round_scale", True, "round_scale/use_ue8m0 only with use_fp8",
                                           "pass use_fp8=True or drop round_scale/use_ue8m0"))
    if use_fp8 and round_scale:
        check_finite_for_round_scale(op, "x", data)
    if prepare_for is not None and not use_fp8:
        raise ContractError(format_problem(op, "prepare_for", repr(prepare_for), "None without use_fp8",
                                           "pass use_fp8=True to prepare FP8 rows, or drop prepare_for"))
    check_count_dtype(op, "cumulative_local_expert_recv_stats", stats, (experts // num_ranks,), (torch.int32,),
                      data.device)
    check_count_dtype(op, "dispatch_wait_recv_cost_stats", wait_stats, (num_ranks, num_ranks), (torch.int64,),
                      data.device)


def check_low_latency_combine_args(op: str, x: Any, topk_idx: Any, topk_weights: Any, handle: Any, num_ranks: int,
                                   out: Any, use_logfmt: Any, zero_copy: Any, async_finish: Any,
                                   return_recv_hook: Any) -> None:
    check_flags(op, use_logfmt=use_logfmt, zero_copy=zero_copy, async_finish=async_finish,
                return_recv_hook=return_recv_hook)
    given = check_low_latency_handle(op, handle, num_ranks)
    per_rank = given.num_experts // num_ranks
    slots = given.num_max_dispatch_tokens_per_rank * num_ranks
    _check_tensor(op, "x", x, X_DTYPES, (per_rank, slots, given.hidden), given.recv_src_info.device,
                  f"pass the expert outputs [L, M*R, H] = [{per_rank}, {slots}, {given.hidden}]")
    _check_topk_idx(op, "topk_idx", topk_idx, given.num_experts, None, None, x.device)
    if topk_idx.shape[0] > given.num_max_dispatch_tokens_per_rank:
        raise ContractError(format_problem(op, "topk_idx", f"of {topk_idx.shape[0]} tokens",
                                           f"at most {given.num_max_dispatch_tokens_per_rank}",
                                           "pass the topk_idx given to low_latency_dispatch"))
    check_topk(op, topk_idx, topk_weights, given.num_experts, topk_idx.shape[0], x.device)
    if topk_weights is None:
        raise ContractError(format_problem(op, "topk_weights", "None", "fp32 [T, k]",
                                           "the low-latency combine is weighted: pass the router's weights"))
    check_count_dtype(op, "out", out, (topk_idx.shape[0], given.hidden), (x.dtype,), x.device)
