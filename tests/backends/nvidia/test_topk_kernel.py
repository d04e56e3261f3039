"""The Triton top-k against DeepSelect's contract, checked by properties (tests/ops/topk/test_topk.py style)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from portable_kernels.backends.nvidia.kernels import topk as topk_kernel  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.testing.generators import randn  # noqa: E402


def _check(x, k, end, values, indices, sorted_, idx_fill, val_fill):
    """Valid slots first: distinct in-range indices, values = x[idx], min(selected) >= max(rest); fills after."""
    b, n = x.shape
    lengths = [n] * b if end is None else end.tolist()
    for r in range(b):
        count = min(k, lengths[r])
        idx = indices[r, :count].long()
        assert idx.unique().numel() == count and bool(((idx >= 0) & (idx < lengths[r])).all())
        if values is not None:
            assert torch.equal(values[r, :count], x[r, idx])
            assert bool((values[r, count:].float() == torch.tensor(val_fill, dtype=x.dtype).float()).all())
        rest = torch.ones(lengths[r], dtype=torch.bool)
        rest[idx] = False
        if count and bool(rest.any()):
            assert x[r, idx].float().min() >= x[r, :lengths[r]][rest].float().max()
        assert bool((indices[r, count:] == idx_fill).all())
        chosen = x[r, idx].float()
        if sorted_:
            assert bool((chosen[1:] <= chosen[:-1]).all())
        else:
            assert bool((idx[1:] > idx[:-1]).all())  # index order (also what sorted_index asks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sorted_", [False, True])
@pytest.mark.parametrize("b,n,k", [(3, 1000, 7), (2, 64, 64), (1, 5000, 300), (2, 10, 16), (4, 1, 1)])
def test_topk_properties(dtype, sorted_, b, n, k):
    x = randn(b, n, seed=n + k, dtype=dtype)
    end = torch.tensor([n, n // 2, 0, 1][:b], dtype=torch.int32) if b > 1 else None
    values, indices = topk_kernel.topk(x, k, end, sorted=sorted_, indices_type=torch.int32, idx_oob_fill_value=-1,
                                       value_oob_fill_value=-1.5)
    _check(x, k, end, values, indices, sorted_, -1, -1.5)


def test_topk_ties_and_signed_zeros_and_infinities():
    x = torch.tensor([[0.0, -0.0, 1.0, 1.0, float("inf"), -float("inf"), 1.0, -2.0, 1.0, 0.5]])
    for k in range(1, 11):
        values, indices = topk_kernel.topk(x, k, sorted=True)
        _check(x, k, None, values, indices, True, 2 ** 31 - 1, float("-inf"))
    values, indices = topk_kernel.topk(x, 4)
    assert indices.tolist() == [[2, 3, 4, 6]]  # ties taken by smaller index, index order out


def test_topk_many_equal_keys_across_chunks():
    """All-equal rows longer than one chunk: the radix select must take exactly k ties."""
    x = torch.full((2, 9000), 3.0)
    values, indices = topk_kernel.topk(x, 4096, return_value=False)
    assert values is None and indices[0].tolist() == list(range(4096))


def test_topk_refuses_bad_arguments():
    with pytest.raises(ContractError, match="topk"):
        topk_kernel.topk(torch.ones(1, 8), 5000)
    with pytest.raises(ContractError, match="end"):
        topk_kernel.topk(torch.ones(2, 8), 2, end=torch.ones(3, dtype=torch.int32))
