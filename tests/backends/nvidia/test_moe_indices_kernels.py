"""The Triton expert-id rewrites (mask_indices_by_tp, map_to_physical_experts,
inplace_unique_group_indices) against the contracts' references: exact integers."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import portable_kernels as pk  # noqa: E402
from portable_kernels.backends.nvidia.kernels import moe_indices  # noqa: E402
from portable_kernels.core.dispatch import trace_providers  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.ops.moe_routing.indices import (map_to_physical_experts_reference,  # noqa: E402
                                                      mask_indices_by_tp_reference, unique_group_indices_reference)
from portable_kernels.testing.generators import generator  # noqa: E402
from portable_kernels.testing.moe_routing_cases import random_topk_idx  # noqa: E402


@pytest.mark.parametrize("spec", [(37, 8, 256, 8, 1, 2), (20, 4, 64, 16, 3, 4), (5, 9, 288, 8, 0, 1),
                                  (300, 8, 64, 4, 1, 4)], ids=str)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_mask_by_tp_is_the_reference(spec, dtype):
    t, k, n, ep, tp_rank, tp = spec
    idx = random_topk_idx(t, k, n, seed=t + n, padding=0.2).to(dtype)
    got = moe_indices.mask_indices_by_tp(idx, n, ep, tp_rank, tp)
    want = mask_indices_by_tp_reference(idx, n, ep, tp_rank, tp)
    assert got.dtype == dtype and torch.equal(got, want)


def test_mask_by_tp_reads_a_transposed_index():
    idx = random_topk_idx(16, 6, 32, seed=2).T
    assert torch.equal(moe_indices.mask_indices_by_tp(idx, 32, 4, 1, 2), mask_indices_by_tp_reference(idx, 32, 4, 1, 2))


@pytest.mark.parametrize("spec", [(37, 8, 32, 3, 0), (1100, 9, 256, 4, 5), (3, 2, 5, 1, 2)], ids=str)
def test_physical_map_is_the_reference(spec):
    t, k, lc, d, ep_rank = spec
    g = generator(t + lc)
    idx = random_topk_idx(t, k, lc, seed=t, padding=0.2)
    table = torch.randint(0, 300, (lc, d), generator=g, dtype=torch.int32)
    count = torch.randint(1, d + 1, (lc,), generator=g, dtype=torch.int32)
    got = moe_indices.map_to_physical_experts(idx.to(torch.int32), table, count, ep_rank)
    assert got.dtype == torch.int64 and torch.equal(got, map_to_physical_experts_reference(idx, table, count, ep_rank))


def test_physical_map_reads_a_strided_table_and_stays_inside_it():
    g = generator(7)
    table = torch.randint(0, 99, (8, 10), generator=g, dtype=torch.int32)[:, ::2]  # [8, 5], column stride 2
    count = torch.randint(1, 6, (8,), generator=g, dtype=torch.int32)
    idx = random_topk_idx(30, 4, 8, seed=8)
    assert torch.equal(moe_indices.map_to_physical_experts(idx, table, count, 3),
                       map_to_physical_experts_reference(idx, table.contiguous(), count, 3))
    outside = torch.tensor([[8, 2 ** 40, -5, 1]])  # ids past the map (unchecked device values) give -1
    got = moe_indices.map_to_physical_experts(outside, table, count, 0)
    assert got[0, :3].tolist() == [-1, -1, -1] and int(got[0, 3]) == int(table[1, 0])


@pytest.mark.parametrize("t,k,groups", [(37, 8, 4), (10, 3, 2), (50, 6, 8), (4, 1, 3)])
def test_unique_groups_is_the_reference_in_place(t, k, groups):
    ids = torch.randint(-1, groups, (t, k), generator=generator(t * k))
    want = unique_group_indices_reference(ids)
    before = ids.data_ptr()
    moe_indices.inplace_unique_group_indices(ids)
    assert ids.data_ptr() == before and torch.equal(ids, want)


def test_unique_groups_rejects_a_strided_tensor():
    with pytest.raises(ContractError, match="group_indices"):
        moe_indices.inplace_unique_group_indices(torch.zeros(8, 4, dtype=torch.int64).T)


def test_public_id_rewrites_and_the_gate_with_replicas_run_on_triton():
    g = generator(11)
    logits = torch.randn(12, 32, generator=g)
    table = torch.randint(0, 36, (33, 5), generator=g, dtype=torch.int32)  # 32 + 4 extra physical experts
    count = torch.randint(1, 6, (33,), generator=g, dtype=torch.int32)
    with pk.use_backend("nvidia"), trace_providers() as ran:
        idx, _ = pk.top2_sum_gate(logits, None, 4, 2, 4, use_shared_as_routed=True, num_shared_experts=1,
                                  to_physical_map=table, logical_count=count, ep_rank=1, num_ep_ranks=4,
                                  tp_rank=1, num_tp_ranks=2)
        groups = torch.randint(0, 4, (12, 4), generator=g)
        want_groups = unique_group_indices_reference(groups)
        pk.inplace_unique_group_indices(groups, 4)
    assert {p for _, _, p in ran} == {"triton"}
    assert [o for o, _, _ in ran] == ["top2_sum_gate", "map_to_physical_experts", "mask_indices_by_tp",
                                      "inplace_unique_group_indices"]
    with pk.use_backend("cpu"):
        want_idx, _ = pk.top2_sum_gate(logits, None, 4, 2, 4, use_shared_as_routed=True, num_shared_experts=1,
                                       to_physical_map=table, logical_count=count, ep_rank=1, num_ep_ranks=4,
                                       tp_rank=1, num_tp_ranks=2)
    assert torch.equal(groups, want_groups) and torch.equal(idx, want_idx)
