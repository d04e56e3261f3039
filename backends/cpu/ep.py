"""cpu provider "reference" for the expert-parallel family: the contract's torch math, all ranks
simulated in this process (get_dispatch_layout is the one op a single rank runs for itself)."""

from __future__ import annotations

from portable_kernels.ep import (GET_DISPATCH_LAYOUT, combine_reference, dispatch_reference,
                                 low_latency_combine_reference, low_latency_dispatch_reference)
from portable_kernels.registry import Registry

from ._names import BACKEND, REFERENCE


def simulate_dispatch(xs, x_scales, topk_idx, topk_weights, is_token_in_rank, num_experts, expert_alignment):
    return dispatch_reference(xs, x_scales, topk_idx, topk_weights, is_token_in_rank, num_experts, expert_alignment)


def simulate_combine(xs, topk_weights, recv_src_rank, recv_src_idx, num_tokens):
    return combine_reference(xs, topk_weights, recv_src_rank, recv_src_idx, num_tokens)


def simulate_low_latency_dispatch(xs, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8, round_scale):
    return low_latency_dispatch_reference(xs, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8,
                                          round_scale)


def simulate_low_latency_combine(xs, topk_idx, topk_weights, recv_src_info, recv_layout_range):
    return low_latency_combine_reference(xs, topk_idx, topk_weights, recv_src_info, recv_layout_range)


def register(registry: Registry) -> None:
    registry.kernel(GET_DISPATCH_LAYOUT.name, BACKEND, REFERENCE)(GET_DISPATCH_LAYOUT.kernel)
    for fn in (simulate_dispatch, simulate_combine, simulate_low_latency_dispatch,
               simulate_low_latency_combine):
        registry.kernel(fn.__name__, BACKEND, REFERENCE)(fn)
