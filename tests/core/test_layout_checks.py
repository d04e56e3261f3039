"""The native layout checks (core/native/layout_checks.py) give the torch checks' verdicts: every
canonical contiguous layout passes, corruptions of one fail, on both paths."""

from __future__ import annotations

import pytest
import torch

from portable_kernels.core.errors import ContractError
from portable_kernels.core.native import layout_checks
from portable_kernels.layouts import contiguous_m_indices
from portable_kernels.ops.gemm import grouped

pytestmark = pytest.mark.skipif(layout_checks.LIB.get() is None, reason="native code unavailable here")


def _torch_accepts(m: torch.Tensor, groups: int, align: int) -> bool:
    """The torch form alone: as int64 the native check does not apply."""
    try:
        grouped._check_m_indices_values("op", m.to(torch.int64), groups, align)
    except ContractError:
        return False
    return True


def _layouts(seed: int):
    """(m_indices int32, groups, alignment, canonical?) — canonical layouts and corruptions of them."""
    g = torch.Generator().manual_seed(seed)

    def draw(n: int) -> int:
        return int(torch.randint(0, n, (1,), generator=g))

    for _ in range(80):
        groups, align = 1 + draw(5), [1, 4, 128][draw(3)]
        counts = torch.randint(0, 9, (groups,), generator=g) * (20 if align == 128 else 1)
        m = contiguous_m_indices(counts, align)
        m = torch.cat([m, torch.full((draw(3),), -1, dtype=torch.int32)])
        yield m, groups, align, True
        if m.numel() == 0:
            continue
        bad = m.clone()
        row = draw(bad.numel())
        bad[row] = [(int(bad[row]) + 1) % groups, -1, -2, groups][draw(4)]
        yield bad, groups, align, None  # usually not canonical any more; the torch form decides
        if int(m[-1]) != -1:
            yield m[:-1], groups, align, None  # the last segment one row short (or one group row fewer)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_native_verdict_is_the_torch_verdict(seed):
    seen = {True: 0, False: 0}
    for m, groups, align, known in _layouts(seed):
        native = layout_checks.m_indices_is_contiguous_layout(m, groups, align)
        assert native == _torch_accepts(m, groups, align), (m.tolist(), groups, align)
        if known is not None:
            assert native == known, (m.tolist(), groups, align)
        seen[native] += 1
    assert seen[True] > 20 and seen[False] > 20  # both verdicts were exercised


def test_the_public_op_still_names_the_bad_row():
    m = contiguous_m_indices(torch.tensor([3, 2]), 4)
    m[1] = 1  # group 1 inside group 0's run
    with pytest.raises(ContractError, match="m_indices.*at row 1"):
        grouped._check_m_indices_values("m_grouped_fp8_gemm_nt_contiguous", m, 2, 4)


def test_a_strided_or_int64_vector_is_left_to_torch():
    m = contiguous_m_indices(torch.tensor([3, 1]), 4)
    assert layout_checks.m_indices_is_contiguous_layout(m.to(torch.int64), 2, 4) is None
    assert layout_checks.m_indices_is_contiguous_layout(torch.stack([m, m], 1)[:, 0], 2, 4) is None
    assert layout_checks.m_indices_is_contiguous_layout(m, 2, 4) is True
