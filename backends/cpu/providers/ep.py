"""cpu provider "reference" for the expert-parallel family: the contract's torch math, all ranks
simulated in this process (get_dispatch_layout is the one op a single rank runs for itself)."""

from __future__ import annotations

from portable_kernels.ops.ep import (combine_reference, dispatch_reference,
                                 low_latency_combine_reference, low_latency_dispatch_reference)
from portable_kernels.core.oracle import REFERENCE_PROVIDER
from portable_kernels.core.registry import Registry

from .._names import BACKEND


def simulate_dispatch(call):
    return dispatch_reference(call.xs, call.x_scales, call.topk_idx, call.topk_weights, call.is_token_in_rank,
                              call.num_experts, call.expert_alignment)


def simulate_combine(call):
    return combine_reference(call.xs, call.topk_weights, call.recv_src_rank, call.recv_src_idx, call.num_tokens)


def simulate_low_latency_dispatch(call):
    return low_latency_dispatch_reference(call.xs, call.topk_idx, call.num_max_dispatch_tokens_per_rank,
                                          call.num_experts, call.use_fp8, call.round_scale)


def simulate_low_latency_combine(call):
    return low_latency_combine_reference(call.xs, call.topk_idx, call.topk_weights, call.recv_src_info,
                                         call.recv_layout_range)


def register(registry: Registry) -> None:
    for fn in (simulate_dispatch, simulate_combine, simulate_low_latency_dispatch,
               simulate_low_latency_combine):
        registry.kernel(fn.__name__, BACKEND, REFERENCE_PROVIDER, doc="all ranks simulated in this process")(fn)
