"""The Buffer's row passes on Gloo ranks: with the cpu backend's native providers (ep.cpp) the
dispatch and combine outputs are byte for byte those of the torch reference kernels (bf16 and FP8
pairs, int64 and int32 ids, with and without weights, one and two biases, num_worst_tokens
padding, dispatch without topk_idx, cached dispatch), on 2 and 4 ranks."""

from __future__ import annotations

import pytest
import torch

from portable_kernels.backends.cpu.providers import ep_rows
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.ops.ep import Buffer, normal_exchange
from portable_kernels.ops.ep.rows import REFERENCE_KERNELS
from portable_kernels.ops.quant.fp8 import per_token_cast_to_fp8
from portable_kernels.testing.ep_cases import random_routing
from portable_kernels.testing.ep_distributed import run_ranks
from portable_kernels.testing.generators import randn

pytestmark = pytest.mark.skipif(ep_rows.LIB.get() is None, reason=f"native EP rows unavailable: {ep_rows.LIB.reason()}")

CASES = ("bf16 weights bias", "fp8 int32 ids two biases", "worst tokens", "no topk", "cached bf16", "cached fp8")


def _flat(value) -> list:
    """Every tensor (and int list) of a Buffer result, in order, events left out."""
    out = []
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        if value and all(isinstance(v, int) for v in value):
            out.append(list(value))
        else:
            for v in value:
                out.extend(_flat(v))
    elif hasattr(value, "rank_prefix_matrix"):  # a DispatchHandle
        out += [value.rank_prefix_matrix, value.recv_src_idx, value.is_token_in_rank]
    return out


def _same(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            if not isinstance(y, torch.Tensor) or x.dtype != y.dtype or x.shape != y.shape:
                return False
            if not torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)):
                return False
        elif x != y:
            return False
    return True


def _cancelling(rows: int, hidden: int, seed: int) -> torch.Tensor:
    """bf16 rows of +-2^24 and +-2^-3: a token's fp32 sum of such rows depends on the order
    ((2^24 - 2^24) + 2^-3 = 2^-3, (2^24 + 2^-3) - 2^24 = 0), so a sum in another order shows."""
    g = torch.Generator().manual_seed(seed)
    big = torch.rand(rows, hidden, generator=g) < 0.5
    sign = torch.where(torch.rand(rows, hidden, generator=g) < 0.5, -1.0, 1.0)
    return (sign * torch.where(big, 2.0 ** 24, 2.0 ** -3)).bfloat16()


def _case(buffer: Buffer, rank: int, num_ranks: int, name: str) -> list:
    tokens, hidden, experts = 48 + 5 * rank, 256, 8 * num_ranks
    ids_dtype = torch.int32 if "int32" in name else torch.int64
    idx = random_routing(tokens, 4, experts, seed=100 + rank, dtype=ids_dtype)
    weights = torch.rand(tokens, 4, generator=torch.Generator().manual_seed(200 + rank))
    x = randn(tokens, hidden, seed=300 + rank, scale=4.0).bfloat16()
    payload = tuple(per_token_cast_to_fp8(x)) if "fp8" in name else x
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx.long(), experts)
    layout = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    out = []
    if name.startswith("cached"):
        first = buffer.dispatch(payload, topk_idx=idx, **layout)
        out.append(buffer.dispatch(payload, handle=first[4])[:5])
        return _flat(out)
    kwargs = dict(layout)
    if name != "no topk":
        kwargs.update(topk_idx=idx)
        if "weights" in name:
            kwargs.update(topk_weights=weights)
    if name == "worst tokens":
        kwargs.update(num_worst_tokens=tokens * num_ranks)
    recv = buffer.dispatch(payload, **kwargs)
    recv_x = recv[0][0] if isinstance(recv[0], tuple) else recv[0]
    received = recv[4].recv_src_idx.numel()
    # recv_x's padding rows (num_worst_tokens) are left unwritten, like DeepEP's; the rest is compared
    scales = [recv[0][1]] if isinstance(recv[0], tuple) else []
    out.append((recv_x[:received], *scales, *recv[1:5]))
    rows = recv_x.shape[0]
    back = _cancelling(rows, hidden, seed=400 + rank)
    biases = [randn(tokens, hidden, seed=500 + rank + i).bfloat16() for i in range(2 if "two biases" in name else 1)]
    combined = buffer.combine(back, recv[4], recv[2], bias=biases[0] if len(biases) == 1 else tuple(biases))
    out.append(combined[:2])
    return _flat(out)


def rows_body(rank: int, num_ranks: int, group) -> dict:
    torch.set_num_threads(1)
    buffer = Buffer(group, int(1e8), timeout=60)
    report = {}
    for name in CASES:
        with trace_providers() as ran:
            native = _case(buffer, rank, num_ranks, name)
        saved = normal_exchange.run_rows
        normal_exchange.run_rows = lambda contract, inputs: REFERENCE_KERNELS[contract.name](inputs)
        try:
            reference = _case(buffer, rank, num_ranks, name)
        finally:
            normal_exchange.run_rows = saved
        report[name] = (_same(native, reference), sorted({(op, p) for op, _, p in ran if op.startswith("ep_")}))
    return report


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_native_row_passes_give_the_reference_bytes_on_every_rank(num_ranks):
    outcomes = run_ranks(num_ranks, rows_body, timeout_s=150)
    assert all(o.ok for o in outcomes), "\n".join(o.describe() for o in outcomes)
    for o in outcomes:
        for name, (same, ran) in o.value.items():
            assert same, f"rank {o.rank}, {name}: native and reference outputs differ"
            assert ran and all(p == "native" for _, p in ran), (o.rank, name, ran)
            if not name.startswith("cached"):
                assert {op for op, _ in ran} >= {"ep_pack_dispatch_rows", "ep_unpack_dispatch_meta"}, (name, ran)
            if name in ("bf16 weights bias", "fp8 int32 ids two biases", "worst tokens", "no topk"):
                assert "ep_combine_rows" in {op for op, _ in ran}, (name, ran)


# -- the layout a Buffer computed itself is not checked again ---------------------------------------

@pytest.fixture
def solo():
    import datetime

    import torch.distributed as dist
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
    return Buffer(group, int(1e8), timeout=30)


def _routed(buffer: Buffer):
    idx = random_routing(16, 2, 8, seed=1)
    x = randn(16, 128, seed=2).bfloat16()
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, 8)
    return x, idx, dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)


def test_dispatch_skips_recomputing_the_layout_this_buffer_returned(solo, monkeypatch):
    from portable_kernels.ops.ep import buffer_checks

    x, idx, layout = _routed(solo)

    def recomputed(*args, **kwargs):
        raise AssertionError("the layout was recomputed")

    monkeypatch.setattr(buffer_checks, "get_dispatch_layout", recomputed)
    recv = solo.dispatch(x, topk_idx=idx, **layout)  # the tensors get_dispatch_layout returned, unchanged
    assert torch.equal(recv[0], x[layout["is_token_in_rank"][:, 0]])
    with pytest.raises(AssertionError, match="recomputed"):  # another tensor with the same ids is checked
        solo.dispatch(x, topk_idx=idx.clone(), **layout)


def test_a_layout_changed_in_place_after_get_dispatch_layout_is_checked_again(solo):
    from portable_kernels.core.errors import ContractError

    x, idx, layout = _routed(solo)
    layout["is_token_in_rank"][0, 0] = ~layout["is_token_in_rank"][0, 0]
    with pytest.raises(ContractError, match="num_tokens_per_rank"):
        solo.dispatch(x, topk_idx=idx, **layout)
    x, idx, layout = _routed(solo)
    idx[0, 0] = 99
    with pytest.raises(ContractError, match="expert id 99"):
        solo.dispatch(x, topk_idx=idx, **layout)


def test_inference_tensors_are_always_checked(solo, monkeypatch):
    from portable_kernels.ops.ep import buffer_checks

    with torch.inference_mode():
        x, idx, layout = _routed(solo)
        calls = []
        real = buffer_checks.get_dispatch_layout
        monkeypatch.setattr(buffer_checks, "get_dispatch_layout", lambda *a: calls.append(1) or real(*a))
        solo.dispatch(x, topk_idx=idx, **layout)  # no version counter: the layout is recomputed
    assert calls == [1]
