"""The cpu backend's native top-k and quantizers (backends/cpu/providers/{topk,casts}.py, kernels/{topk,casts}.cpp): top-k by
properties on odd shapes, ties, lengths and fills; quantizers against the references (codes,
scales, NaN propagation), SwiGLU's padding rows and clamp counts; bad arguments refused."""

from __future__ import annotations

import pytest
import torch

from portable_kernels.backends.cpu.providers import casts as nc
from portable_kernels.backends.cpu.providers import topk as nt
from portable_kernels.core.errors import ContractError
from portable_kernels.ops.quant.fp4 import quantize_fp4_reference
from portable_kernels.ops.swiglu import swiglu_forward_and_per_token_cast_reference
from portable_kernels.ops.quant.fp8 import QuantTensor, quantize_blocks_reference
from portable_kernels.testing.checks import assert_quantization_matches
from portable_kernels.testing.generators import randn

from threads import run_interleaved

needs_topk = pytest.mark.skipif(not nt.LIB.get(), reason=f"native topk unavailable: {nt.LIB.reason()}")
needs_casts = pytest.mark.skipif(not nc.LIB.get(), reason=f"native casts unavailable: {nc.LIB.reason()}")


def _check_topk(x, k, end, values, indices, sorted_, idx_fill=2**31 - 1):
    b, n = x.shape
    lengths = [n] * b if end is None else end.tolist()
    for r in range(b):
        cnt = min(k, lengths[r])
        idx = indices[r, :cnt].long()
        assert bool(((idx >= 0) & (idx < lengths[r])).all()), "index outside the valid range"
        assert idx.unique().numel() == cnt, "repeated index"
        row = x[r, :lengths[r]].float()
        chosen = row[idx]
        if cnt < lengths[r]:
            rest = torch.ones(lengths[r], dtype=torch.bool)
            rest[idx] = False
            assert float(chosen.min()) >= float(row[rest].max())
        assert bool((indices[r, cnt:] == idx_fill).all())
        if values is not None:
            assert torch.equal(values[r, :cnt], x[r, idx])
            assert bool(torch.isneginf(values[r, cnt:].float()).all())
        if sorted_:
            assert bool((chosen[:-1] >= chosen[1:]).all())
        else:
            assert bool((idx[:-1] < idx[1:]).all()), "unsorted output is in index order"


@needs_topk
@pytest.mark.parametrize("b,n,k", [(1, 1, 1), (1, 1024, 8), (3, 100, 100), (2, 50, 64), (4, 4096, 512),
                                   (1, 131072, 2048), (0, 10, 3), (5, 0, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sorted_", [False, True])
def test_topk_selects_the_largest_with_fills(b, n, k, dtype, sorted_):
    x = randn(b, n, seed=b + n + k, dtype=dtype)
    values, indices = nt.topk_native(x, k, sorted=sorted_)
    assert values.shape == indices.shape == (b, k)
    _check_topk(x, k, None, values, indices, sorted_)


@needs_topk
@pytest.mark.parametrize("k", [5, 40, 300])
def test_topk_with_ties_lengths_and_int32(k):
    x = torch.randint(-3, 4, (6, 700), generator=torch.Generator().manual_seed(k)).float()
    x[0, :] = -0.0
    x[1, ::2] = 0.0
    x[2, 5] = float("inf")
    x[3, 7] = float("-inf")
    end = torch.tensor([700, 3, 0, 650, 299, 1], dtype=torch.int32)
    values, indices = nt.topk_native(x, k, end=end, indices_type=torch.int32, idx_oob_fill_value=-1)
    assert indices.dtype == torch.int32
    _check_topk(x, k, end, values, indices, False, idx_fill=-1)


@needs_topk
def test_topk_reads_strided_rows_and_fills_in_the_input_dtype():
    wide = randn(4, 300, seed=3)
    x = wide[:, :256]
    values, indices = nt.topk_native(x, 16, value_oob_fill_value=-1e40, return_value=True)
    _check_topk(x, 16, None, values, indices, False)
    v, _ = nt.topk_native(x.bfloat16(), 300, value_oob_fill_value=1.0e-3)
    assert v.dtype == torch.bfloat16 and float(v[0, -1]) == float(torch.tensor(1.0e-3).bfloat16())
    assert nt.topk_native(x, 4, return_value=False)[0] is None


@needs_topk
def test_topk_refuses_bad_arguments():
    with pytest.raises(ContractError, match="'end'"):
        nt.topk_native(randn(2, 8, seed=1), 2, end=torch.tensor([1, 2]))
    with pytest.raises(ContractError, match="'input'"):
        nt.topk_native(randn(2, 8, seed=1).double(), 2)


@needs_casts
@pytest.mark.parametrize("shape,gran", [((1, 1), (1, 128)), ((3, 300), (1, 128)), ((130, 257), (128, 128)),
                                        ((2, 5, 200), (1, 64)), ((0, 128), (1, 128)), ((7, 96), (3, 32))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_casts_match_the_reference(shape, gran, dtype, ue8m0):
    x = randn(*shape, seed=sum(shape), dtype=dtype, scale=3.0)
    q, s = nc.cast_fp8(x, gran, ue8m0)
    want_q, want_s = quantize_blocks_reference(x, gran[0], gran[1], ue8m0)
    assert torch.equal(s, want_s)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))


@needs_casts
def test_fp8_cast_propagates_nan_into_its_block():
    x = randn(2, 256, seed=5)
    x[1, 130] = float("nan")
    q, s = nc.cast_fp8(x, (1, 128), False)
    assert bool(torch.isnan(s[1, 1])) and not bool(torch.isnan(s).sum() > 1)
    assert bool(torch.isnan(q[1, 130].float()))


@needs_casts
@pytest.mark.parametrize("shape,gran_k", [((1, 2), 32), ((3, 300), 32), ((4, 256), 128), ((2, 3, 64), 32)])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp4_cast_matches_the_reference(shape, gran_k, ue8m0):
    x = randn(*shape, seed=sum(shape), dtype=torch.bfloat16, scale=2.0)
    q, s = nc.cast_fp4(x, gran_k, ue8m0)
    want_q, want_s = quantize_fp4_reference(x, gran_k, ue8m0)
    assert torch.equal(s, want_s)
    assert torch.equal(q, want_q)


@needs_casts
@pytest.mark.parametrize("m,inter,per", [(1, 1, 128), (5, 200, 128), (33, 256, 64)])
def test_swiglu_cast_matches_the_reference_with_padding_and_clamp(m, inter, per):
    x = randn(m, 2 * inter, seed=m + inter, dtype=torch.bfloat16, scale=4.0)
    weights = randn(m, 2, seed=7).abs()
    p2t = torch.arange(m, dtype=torch.int32) * 2 % (2 * m)
    p2e = torch.zeros(m, dtype=torch.int32)
    p2e[::3] = -1
    counts = torch.zeros(3, dtype=torch.int64)
    q, s = nc.swiglu_cast(x, per, False, p2t, weights, p2e, 3.0, counts)
    want_q, want_s = swiglu_forward_and_per_token_cast_reference(x, per, False, p2t, weights, p2e, 3.0)
    assert_quantization_matches(QuantTensor(q, s, (1, per)), QuantTensor(want_q, want_s, (1, per)), exact_scales=False)
    assert bool((q[::3].view(torch.uint8) == 0).all())
    valid = p2e >= 0
    gate, up = x[valid].float().chunk(2, dim=-1)
    assert counts.tolist() == [int((gate > 3).sum()), int((up > 3).sum()), int((up < -3).sum())]


@needs_casts
def test_casts_refuse_bad_arguments():
    with pytest.raises(ContractError, match="'x'"):
        nc.cast_fp4(randn(2, 5, seed=1), 32, True)
    with pytest.raises(ContractError, match="'x'"):
        nc.cast_fp8(randn(2, 5, seed=1).double(), (1, 128), False)
    with pytest.raises(ContractError, match="'pos_to_expert'"):
        nc.swiglu_cast(randn(4, 8, seed=1), 128, False, pos_to_expert=torch.zeros(3, dtype=torch.int32))


@needs_topk
def test_topk_finds_nan_in_its_own_pass_and_refuses_it():
    x = randn(3, 100, seed=2)
    x[1, 40] = float("nan")
    with pytest.raises(ContractError, match="NaN inside the valid range"):
        nt.topk_native(x, 4)
    end = torch.tensor([100, 40, 100], dtype=torch.int32)  # the NaN lies past row 1's end: fine
    values, indices = nt.topk_native(x, 4, end=end)
    _check_topk(x, 4, end, values, indices, False)
    with pytest.raises(ContractError, match="NaN"):
        nt.topk_native(x.bfloat16(), 64)


@needs_casts
def test_casts_refuse_nonfinite_blocks_when_scales_are_powers_of_two():
    x = randn(2, 256, seed=6)
    x[0, 3] = float("inf")
    with pytest.raises(ContractError, match="'x'"):
        nc.cast_fp8(x, (1, 128), True)
    with pytest.raises(ContractError, match="'x'"):
        nc.cast_fp4(x, 32, True)
    with pytest.raises(ContractError, match="'x'"):
        nc.swiglu_cast(x, 128, True)
    q, s = nc.cast_fp8(x, (1, 128), False)  # without UE8M0 the Inf stays in its block
    assert bool(torch.isinf(s[0, 0])) and bool(torch.isfinite(s[1]).all())


# -- the small-call path: packed arguments, outputs from templates ---------------------------------------

@needs_topk
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_topk_agrees_with_torch_topk(ties, dtype):
    # one row of 1024, k=8 (the decode shape): the same values as torch.topk in sorted order, and
    # indices that point at them (ties may pick other equal elements, so indices are checked by value)
    for seed in range(20):
        x = randn(1, 1024, seed=seed)
        if ties:
            x = (x * 2).round()  # few distinct values: many ties at the k-th
        x = x.to(dtype)
        values, indices = nt.topk_native(x, 8, sorted=True)
        expected, _ = torch.topk(x, 8)
        assert torch.equal(values, expected)
        assert torch.equal(x[0, indices[0]], values[0])
        assert indices[0].unique().numel() == 8
        _check_topk(x, 8, None, values, indices, True)


@needs_topk
def test_topk_outputs_are_new_contiguous_tensors_on_every_call():
    x = randn(1, 1024, seed=4)
    first = nt.topk_native(x, 8)
    second = nt.topk_native(x, 8)
    for a, b in zip(first, second):
        assert a.is_contiguous() and a.shape == (1, 8)
        assert a.data_ptr() != b.data_ptr()
        assert torch.equal(a, b)
    values, indices = nt.topk_native(randn(3, 50, seed=5), 60, indices_type=torch.int32, idx_oob_fill_value=-1)
    assert values.shape == indices.shape == (3, 60) and indices.dtype == torch.int32 and indices.is_contiguous()
    assert bool((indices[:, 50:] == -1).all())


@needs_topk
def test_topk_refuses_a_fill_that_is_not_an_int64():
    x = randn(1, 16, seed=1)
    for fill in (2**63, 1.5, None):
        with pytest.raises(ContractError, match="'idx_oob_fill_value'"):
            nt.topk_native(x, 2, idx_oob_fill_value=fill)


@needs_topk
def test_the_packed_topk_call_matches_the_library():
    assert nt.LIB.get().pk_topk_call_size() == nt._CALL.size


@needs_topk
def test_concurrent_topk_calls_from_python_threads():
    inputs = [randn(1 + i, 1000 + 37 * i, seed=i) for i in range(4)]
    expected = [nt.topk_native(x, 8 + i, sorted=True) for i, x in enumerate(inputs)]
    errors = []

    def work(i):
        for _ in range(2000):
            values, indices = nt.topk_native(inputs[i], 8 + i, sorted=True)
            if not (torch.equal(values, expected[i][0]) and torch.equal(indices, expected[i][1])):
                errors.append(i)
                return

    run_interleaved(work, len(inputs))
    assert errors == []


@needs_topk
def test_a_negative_zero_fill_keeps_its_sign_after_a_positive_zero_fill():
    x = randn(1, 4, seed=6)
    for dtype, bits in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16)):
        for fill in (0.0, -0.0, 0.0):
            values, _ = nt.topk_native(x.to(dtype), 6, value_oob_fill_value=fill)
            expected = torch.tensor([fill], dtype=dtype).view(bits)
            assert bool((values[0, 4:].view(bits) == expected).all())
