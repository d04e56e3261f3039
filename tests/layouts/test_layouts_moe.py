"""MoE grouped-GEMM row layouts: contiguous m_indices, psum, masked."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from portable_kernels.layouts import (
    ASCEND_MOE_ALIGNMENT,
    NVIDIA_MOE_ALIGNMENT,
    LayoutConversionError,
    aligned_counts,
    check_masked_m,
    contiguous_m_indices,
    contiguous_total_m,
    counts_from_m_indices,
    counts_from_psum,
    m_indices_from_psum,
    masked_m_from_counts,
    psum_layout,
    segment_starts,
)

FAST = settings(max_examples=50, deadline=None, derandomize=True)
COUNTS = torch.tensor([3, 0, 5])


def test_alignments_are_128_nvidia_and_256_ascend():
    assert (NVIDIA_MOE_ALIGNMENT, ASCEND_MOE_ALIGNMENT) == (128, 256)


def test_contiguous_m_indices_pads_each_segment_with_minus_one():
    m = contiguous_m_indices(COUNTS, 4)
    assert m.dtype == torch.int32
    assert m.tolist() == [0, 0, 0, -1, 2, 2, 2, 2, 2, -1, -1, -1]


def test_segment_starts_are_exclusive_sums_of_aligned_counts():
    assert segment_starts(COUNTS, 4).tolist() == [0, 4, 4]
    assert aligned_counts(COUNTS, 4).tolist() == [4, 0, 8]
    assert contiguous_total_m(COUNTS, 4) == 12


def test_psum_is_end_row_after_aligning_previous_end():
    # psum[g] = align(psum[g-1], 4) + count[g]: 0 + 3, align(3) + 0, align(4) + 5
    assert psum_layout(COUNTS, 4).tolist() == [3, 4, 9]


def test_psum_ascend_alignment_256_example():
    assert psum_layout(torch.tensor([300, 10, 256]), 256).tolist() == [300, 522, 1024]


def test_counts_from_psum_inverts_psum():
    assert counts_from_psum(torch.tensor([3, 4, 9]), 4).tolist() == [3, 0, 5]


def test_m_indices_from_psum_marks_rows_past_last_group():
    m = m_indices_from_psum(torch.tensor([3, 4, 9], dtype=torch.int32), 4, 14)
    assert m.tolist() == [0, 0, 0, -1, 2, 2, 2, 2, 2, -1, -1, -1, -1, -1]


def test_m_indices_from_psum_may_stop_at_last_end_row():
    assert m_indices_from_psum(torch.tensor([3, 4, 9]), 4, 9).tolist() == [0, 0, 0, -1, 2, 2, 2, 2, 2]


def test_m_indices_from_psum_refuses_too_few_rows():
    with pytest.raises(LayoutConversionError, match="smaller than the last psum row"):
        m_indices_from_psum(torch.tensor([3, 4, 9]), 4, 8)


def test_counts_from_psum_refuses_a_group_starting_before_the_aligned_previous_end():
    with pytest.raises(LayoutConversionError, match="not a valid psum"):
        counts_from_psum(torch.tensor([3, 3]), 4)  # group 1 would start at 4 > 3


def test_counts_from_m_indices_ignores_padding_rows():
    assert counts_from_m_indices(torch.tensor([0, 0, 0, -1, 2, 2, -1]), 4).tolist() == [3, 0, 2, 0]


def test_counts_from_m_indices_refuses_out_of_range_groups():
    with pytest.raises(LayoutConversionError, match="-1 or in"):
        counts_from_m_indices(torch.tensor([0, 3]), 3)


def test_negative_counts_are_refused():
    with pytest.raises(LayoutConversionError, match=">= 0"):
        contiguous_m_indices(torch.tensor([2, -1]), 128)


def test_counts_must_be_integer_vector():
    with pytest.raises(LayoutConversionError, match="1-D integer"):
        psum_layout(torch.tensor([1.0, 2.0]), 128)


def test_masked_m_is_int32_counts_and_checked_against_max_m():
    masked = masked_m_from_counts(torch.tensor([5, 0, 7], dtype=torch.int64))
    assert masked.dtype == torch.int32 and masked.tolist() == [5, 0, 7]
    check_masked_m(masked, 7)
    with pytest.raises(LayoutConversionError, match="max_m=6"):
        check_masked_m(masked, 6)


@FAST
@given(
    counts=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    alignment=st.sampled_from([1, 4, 128, 256]),
)
def test_every_form_round_trips_through_counts(counts, alignment):
    c = torch.tensor(counts, dtype=torch.int32)
    m = contiguous_m_indices(c, alignment)
    assert m.numel() == sum((x + alignment - 1) // alignment * alignment for x in counts)
    assert torch.equal(counts_from_m_indices(m, len(counts)), c)
    psum = psum_layout(c, alignment)
    assert torch.equal(counts_from_psum(psum, alignment), c)
    assert torch.equal(m_indices_from_psum(psum, alignment, m.numel()), m)
    starts = segment_starts(c, alignment)
    assert bool((starts % alignment == 0).all()) and torch.equal(psum, starts + c)


def test_large_moe_layout_with_256_experts_is_vectorized():
    counts = torch.randint(0, 2000, (256,), generator=torch.Generator().manual_seed(3))
    m = contiguous_m_indices(counts, ASCEND_MOE_ALIGNMENT)
    assert torch.equal(counts_from_m_indices(m, 256), counts.to(torch.int32))
