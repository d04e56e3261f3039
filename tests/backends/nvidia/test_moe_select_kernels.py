"""The Triton stable selections (topk_gate, topk_sum_and_topk_group_idx) against the contracts'
references: the same indices in the same order, ties to the smaller index."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import portable_kernels as pk  # noqa: E402
from portable_kernels.backends.nvidia.kernels import moe_select  # noqa: E402
from portable_kernels.core.dispatch import trace_providers  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.ops.moe_routing.select import (topk_gate_reference,  # noqa: E402
                                                     topk_sum_and_topk_group_idx_reference)
from portable_kernels.testing.generators import randn  # noqa: E402


def _tied(*shape: int, seed: int) -> torch.Tensor:
    """Scores whose odd entries along the last dim repeat the even ones: only the tie rule orders them."""
    s = randn(*shape, seed=seed)
    s[..., 1::2] = s[..., 0::2][..., : s[..., 1::2].shape[-1]]
    return s


@pytest.mark.parametrize("t,e,k", [(37, 256, 8), (5, 24, 6), (9, 3, 3), (16, 64, 1), (3, 300, 9)])
def test_topk_gate_is_the_reference_with_ties(t, e, k):
    scores = _tied(t, e, seed=t + e)
    scores[0, :2] = torch.tensor([-0.0, 0.0])  # equal in the ranking: the smaller index first
    assert torch.equal(moe_select.topk_gate(scores, k), topk_gate_reference(scores, k))


def test_topk_gate_reads_strided_scores():
    scores = randn(64, 20, seed=3).T  # [20, 64]
    assert torch.equal(moe_select.topk_gate(scores, 5), topk_gate_reference(scores.contiguous(), 5))


@pytest.mark.parametrize("t,g,p,n,kg", [(37, 8, 32, 2, 4), (5, 3, 8, 3, 2), (9, 8, 1, 1, 8), (6, 5, 6, 2, 1)])
def test_group_select_is_the_reference_with_tied_groups(t, g, p, n, kg):
    scores = randn(t, g, p, seed=t * g + p)
    scores[:, 1::2] = scores[:, 0::2][:, : scores[:, 1::2].shape[1]]  # groups in equal pairs
    assert torch.equal(moe_select.topk_sum_and_topk_group_idx(scores, n, kg),
                       topk_sum_and_topk_group_idx_reference(scores, n, kg))


def test_group_select_counts_a_repeated_best_score_twice():
    scores = torch.tensor([[[3.0, 3.0, 0.0], [4.0, 1.0, 1.0]]])  # sums of the 2 best: 6 and 5
    assert moe_select.topk_sum_and_topk_group_idx(scores, 2, 1).tolist() == [[0]]


def test_selections_reject_a_k_past_the_row():
    with pytest.raises(ContractError, match="num_topk"):
        moe_select.topk_gate(randn(4, 8, seed=1), 9)
    with pytest.raises(ContractError, match="num_topk_groups"):
        moe_select.topk_sum_and_topk_group_idx(randn(4, 2, 4, seed=1), 2, 3)


def test_public_selections_run_on_triton():
    scores = randn(12, 64, seed=5)
    with pk.use_backend("nvidia"), trace_providers() as ran:
        idx = pk.topk_gate(scores, 6)
        groups = pk.topk_sum_and_topk_group_idx(scores.view(12, 8, 8), 2, 4)
    assert ran == [("topk_gate", "nvidia", "triton"), ("topk_sum_and_topk_group_idx", "nvidia", "triton")]
    assert torch.equal(idx, topk_gate_reference(scores, 6))
    assert torch.equal(groups, topk_sum_and_topk_group_idx_reference(scores.view(12, 8, 8), 2, 4))
