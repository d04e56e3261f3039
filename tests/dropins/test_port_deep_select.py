"""DeepSelect call sites ported with one import (`import portable_kernels.deep_select as deep_select`),
in the style of DeepSelect's own tests (written here): selections checked by properties, its
interface validation (errors before any kernel, ValueError / TypeError as its tests expect), index
offsets and fills, preallocated outputs, the NaN policy and the stride requirement."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
import portable_kernels.deep_select as deep_select

MARKER = 0x3F3F3F3F


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _check_selection(x, values, indices, topk, end=None):
    """DeepSelect's properties: valid slots first, unique in-range indices, values = x[idx], and
    min(selected) >= max(unselected valid)."""
    for i in range(x.shape[0]):
        n = x.shape[1] if end is None else int(end[i])
        count = min(topk, n)
        idx = indices[i, :count].long()
        assert idx.unique().numel() == count and ((idx >= 0) & (idx < n)).all()
        assert torch.equal(values[i, :count], x[i, idx])
        rest = torch.ones(n, dtype=torch.bool)
        rest[idx] = False
        if count and rest.any():
            assert x[i, idx].min() >= x[i, :n][rest].max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sorted_, sorted_index", [(False, False), (True, False), (False, True)])
def test_topk_properties(dtype, sorted_, sorted_index):
    x = torch.randn(6, 4096).to(dtype)
    end = torch.tensor([4096, 100, 7, 0, 2048, 1], dtype=torch.int32)
    values, indices = deep_select.topk(x, 64, sorted=sorted_, end=end, indices_type=torch.int32,
                                       sorted_index=sorted_index)
    assert values.dtype == dtype and indices.dtype == torch.int32
    _check_selection(x, values, indices, 64, end)
    assert (indices[3] == 2 ** 31 - 1).all() and torch.isneginf(values[3]).all()
    if sorted_:
        assert (values[0, 1:] <= values[0, :-1]).all()
    if sorted_index:
        assert (indices[0, 1:] > indices[0, :-1]).all()


def test_interface_validation_matches_deepselect_error_types():
    x = torch.empty(1, 32)
    with pytest.raises(ValueError):
        deep_select.topk(x, 4, return_value=False, begin=torch.empty(1, dtype=torch.int32))
    with pytest.raises(ValueError):
        deep_select.topk(x, 4, return_value=False, hint=torch.empty(1, dtype=torch.int32))
    with pytest.raises(TypeError):
        deep_select.topk(x, 4, return_value=False, output_idx=torch.empty(1, 4, dtype=torch.int32),
                         indices_type=torch.int64)


def test_preallocated_output_is_written_and_returned():
    x = torch.randn(2, 300)
    out = torch.full((2, 8), -5, dtype=torch.int64)
    values, returned = deep_select.topk(x, 8, return_value=False, output_idx=out, indices_type=torch.int64)
    assert values is None and returned is out
    _check_selection(x, x.gather(1, out), out, 8)


def test_sorted_offsets_and_padding_like_deepselect():
    vocab_size, topk = 8192, 8
    offsets = torch.tensor([2 ** 31 - 1, -(2 ** 31), -1, 0, 1], dtype=torch.int32)
    inputs = torch.arange(vocab_size, dtype=torch.float32).repeat(len(offsets), 1)
    for end_value in (vocab_size, topk, 3, 0):
        for fill in (2 ** 31 - 1, -(2 ** 31), -1):
            end = torch.full_like(offsets, end_value)
            values, indices = deep_select.topk(inputs, topk, sorted=True, end=end, output_idx_offset=offsets,
                                               idx_oob_fill_value=fill, indices_type=torch.int64)
            count = min(end_value, topk)
            selected = torch.arange(end_value - 1, end_value - count - 1, -1)
            want = torch.full_like(indices, fill)
            want[:, :count] = selected + offsets.to(torch.int64)[:, None]
            want_values = torch.full_like(values, float("-inf"))
            want_values[:, :count] = selected.to(torch.float32)
            assert torch.equal(indices, want) and torch.equal(values, want_values)


def test_nan_rows_abort_by_default_or_write_the_marker():
    x = torch.randn(3, 256)
    x[1, 17] = float("nan")
    x[2, 200] = float("nan")
    end = torch.tensor([256, 256, 100], dtype=torch.int32)  # row 2's NaN lies past its end: ignored
    with pytest.raises(ValueError, match="NaN"):
        deep_select.topk(x, 8, end=end)
    values, indices = deep_select.topk(x, 8, end=end, abort_when_nan_found=False)
    assert (indices[1] == MARKER).all() and torch.isnan(values[1]).all()
    _check_selection(x[[0, 2]], values[[0, 2]], indices[[0, 2]], 8, end[[0, 2]])
    assert deep_select.NAN_ROW_MARKER == MARKER


def test_stride_requirement():
    assert deep_select.get_stride_requirement() == (16, 32)
    x = torch.randn(4, 1000)
    padded = torch.empty(4, 1024)[:, :1000]                 # rows padded to the input requirement, as callers do
    padded.copy_(x)
    assert torch.equal(deep_select.topk(padded, 5)[1], deep_select.topk(x, 5)[1])


# -- DeepSelect's host checks (its tests/test_memory_boundaries.py, CUDA build) -------------------

def test_overlapping_output_rows_get_deep_selects_message_on_every_backend():
    x = torch.ones((2, 256))
    output = torch.empty((1, 8), dtype=torch.int32)[:, :1].expand(2, 1)
    with pytest.raises(RuntimeError, match="output_index rows must not overlap"):
        deep_select.topk(x, 1, output_idx=output, indices_type=torch.int32)
    with pytest.raises(pk.ContractError, match="output_index rows must not overlap"):
        deep_select.topk(x, 1, output_idx=output, indices_type=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvidia_needs_the_final_row_padded_as_deep_selects_tma_reads_it(dtype):
    stride = 1024 // dtype.itemsize
    width, row_stride = stride + 1, 2 * stride
    x = torch.ones(row_stride + width, dtype=dtype).as_strided((2, width), (row_stride, 1))
    padded = torch.ones((2, row_stride), dtype=dtype)[:, :width]
    with pk.use_backend("nvidia", arch="sm100"):
        with pytest.raises(RuntimeError, match="input backing storage"):
            deep_select.topk(x, 1)
        values, _ = deep_select.topk(padded, 1)
    torch.testing.assert_close(values, torch.ones_like(values))
    assert deep_select.topk(x, 1)[0].shape == (2, 1)  # cpu: rows of any padding


def test_nvidia_needs_aligned_views_and_padded_row_strides():
    x = torch.ones((2, 512))
    backing = torch.empty((2, 16), dtype=torch.int32)
    with pk.use_backend("nvidia", arch="sm90"):
        with pytest.raises(RuntimeError, match=r"input\.data_ptr"):
            deep_select.topk(x[:, 1:257], 1)
        with pytest.raises(RuntimeError, match=r"output_index\.data_ptr"):
            deep_select.topk(x, 1, output_idx=backing[:, 1:2], indices_type=torch.int32)
        with pytest.raises(RuntimeError, match=r"input\.stride\(0\)"):
            deep_select.topk(torch.ones(2, 1001)[:, :1000], 1)
        with pytest.raises(RuntimeError, match=r"output_index\.stride\(0\)"):
            deep_select.topk(x, 1, output_idx=torch.empty(2, 3, dtype=torch.int32)[:, :1], indices_type=torch.int32)
        minimal = torch.empty(16, dtype=torch.int32).as_strided((2, 1), (8, 1))  # rows at bytes 0 and 32
        end = torch.ones(2, dtype=torch.int32)
        _, indices = deep_select.topk(torch.ones(2, 256), 1, end=end, output_idx=minimal, indices_type=torch.int32)
    assert torch.equal(indices, torch.zeros_like(indices))
