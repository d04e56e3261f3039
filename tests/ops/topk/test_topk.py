"""topk (DeepSelect contract): property checks on adversarial rows, exact edges, the checker's own
teeth, a bad-input catalogue, and the quick conformance run."""

import pytest
import torch

from portable_kernels import ContractError, topk
from portable_kernels.testing import CaseFailure, run_conformance
from portable_kernels.testing.generators import randn
from portable_kernels.testing.topk_cases import KINDS, check_topk, random_end, topk_input

DTYPES = (torch.float32, torch.bfloat16)
ORDERS = {"none": {}, "value": {"sorted": True}, "index": {"sorted_index": True}}


def _bits(x):
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("order", ORDERS)
def test_selection_properties_hold_on_adversarial_rows(kind, dtype, order):
    seed = 11 + KINDS.index(kind)
    x = topk_input(6, 203, kind, seed, dtype)
    end = random_end(6, 203, 24, seed + 1)
    values, indices = topk(x, 24, end=end, **ORDERS[order])
    check_topk(x, 24, end, values, indices, **ORDERS[order])


@pytest.mark.parametrize("indices_type", (torch.int32, torch.int64), ids=str)
def test_indices_type_and_values_dtype_follow_the_arguments(indices_type):
    x = randn(3, 50, seed=1, dtype=torch.bfloat16)
    values, indices = topk(x, 5, indices_type=indices_type)
    assert indices.dtype == indices_type and values.dtype == torch.bfloat16
    check_topk(x, 5, None, values, indices, indices_type=indices_type)


def test_sorted_values_equal_torch_topk_on_distinct_values():
    x = randn(4, 1000, seed=2)
    values, indices = topk(x, 37, sorted=True)
    want = torch.topk(x, 37)
    assert torch.equal(values, want.values) and torch.equal(indices, want.indices)


def test_sorted_index_returns_increasing_indices():
    x = randn(4, 300, seed=3)
    _, indices = topk(x, 40, sorted_index=True)
    assert bool((indices.diff(dim=1) > 0).all())
    assert torch.equal(indices, torch.topk(x, 40).indices.sort(1).values)


def test_short_rows_put_valid_elements_first_then_default_fills():
    x = randn(3, 10, seed=4)
    end = torch.tensor([10, 2, 0], dtype=torch.int32)
    values, indices = topk(x, 4, end=end)
    assert indices[1, 2:].tolist() == [2**31 - 1] * 2 and sorted(indices[1, :2].tolist()) == [0, 1]
    assert indices[2].tolist() == [2**31 - 1] * 4
    assert bool(torch.isneginf(values[2]).all()) and bool(torch.isneginf(values[1, 2:]).all())


def test_custom_fill_values_are_written_in_the_output_dtypes():
    x = randn(2, 6, seed=5, dtype=torch.bfloat16)
    values, indices = topk(x, 8, indices_type=torch.int32, idx_oob_fill_value=-1, value_oob_fill_value=-7.0)
    assert indices[:, 6:].tolist() == [[-1, -1]] * 2
    assert values[:, 6:].float().tolist() == [[-7.0, -7.0]] * 2
    check_topk(x, 8, None, values, indices, indices_type=torch.int32, idx_oob_fill_value=-1,
               value_oob_fill_value=-7.0)


def test_nan_past_end_is_ignored():
    x = randn(2, 20, seed=6)
    x[:, 12:] = float("nan")
    end = torch.tensor([12, 5], dtype=torch.int32)
    values, indices = topk(x, 6, end=end, sorted=True)
    check_topk(x, 6, end, values, indices, sorted=True)
    assert not bool(values[0].isnan().any())


def test_nan_inside_the_valid_range_is_refused_naming_input():
    x = randn(2, 20, seed=7)
    x[1, 3] = float("nan")
    with pytest.raises(ContractError, match="'input'.*\\[1, 3\\]"):
        topk(x, 4)


def test_ties_go_to_the_smaller_index_on_the_cpu_reference():
    x = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0, 2.0]])
    _, indices = topk(x, 3, sorted=True)
    assert indices.tolist() == [[1, 2, 3]]


def test_signed_zeros_compare_equal_and_keep_their_sign_bits():
    x = torch.tensor([[-1.0, -0.0, 0.0, -2.0]])
    values, indices = topk(x, 2, sorted_index=True)
    assert indices.tolist() == [[1, 2]]
    assert torch.equal(_bits(values), _bits(torch.tensor([[-0.0, 0.0]])))


def test_infinities_are_ordinary_values():
    x = torch.tensor([[float("-inf"), 3.0, float("inf"), float("-inf")]])
    values, indices = topk(x, 3, sorted=True)
    assert indices.tolist() == [[2, 1, 0]] and values[0, 0] == float("inf")
    values, indices = topk(x, 4, end=torch.tensor([4], dtype=torch.int32), sorted=True)
    assert sorted(indices[0, 2:].tolist()) == [0, 3]  # both -inf elements are selections, not fills


def test_huge_row_of_2_pow_17_columns():
    x = topk_input(2, 1 << 17, "randn", 8, torch.bfloat16)
    end = torch.tensor([1 << 17, 70000], dtype=torch.int32)
    values, indices = topk(x, 4096, end=end, indices_type=torch.int32)
    check_topk(x, 4096, end, values, indices, indices_type=torch.int32)


def test_topk_larger_than_the_row_fills_the_rest():
    x = randn(2, 5, seed=9)
    values, indices = topk(x, 4096, sorted=True)
    check_topk(x, 4096, None, values, indices, sorted=True)
    assert torch.equal(values[:, :5], x.sort(1, descending=True).values)


def test_empty_batch_and_empty_rows():
    values, indices = topk(torch.empty(0, 7), 3)
    assert values.shape == (0, 3) and indices.shape == (0, 3)
    values, indices = topk(torch.empty(2, 0), 3)
    assert indices.tolist() == [[2**31 - 1] * 3] * 2


def test_return_value_false_returns_no_values():
    x = randn(3, 40, seed=10)
    values, indices = topk(x, 4, return_value=False)
    assert values is None
    check_topk(x, 4, None, None, indices, return_value=False)


# -- the checker must reject wrong answers ------------------------------------------------------

def _good(seed=12):
    x = randn(3, 64, seed=seed)
    values, indices = topk(x, 8, sorted=True)
    return x, values.clone(), indices.clone()


def test_checker_rejects_a_duplicated_index():
    x, values, indices = _good()
    indices[0, 1] = indices[0, 0]
    values[0, 1] = values[0, 0]
    with pytest.raises(CaseFailure, match="twice"):
        check_topk(x, 8, None, values, indices)


def test_checker_rejects_values_not_equal_to_input_at_indices():
    x, values, indices = _good()
    values[1, 3] += 1.0
    with pytest.raises(CaseFailure, match="input\\[indices\\]"):
        check_topk(x, 8, None, values, indices)


def test_checker_rejects_a_non_maximal_selection():
    x, values, indices = _good()
    smallest = int(x[2].argmin())
    indices[2, 7], values[2, 7] = smallest, x[2, smallest]
    with pytest.raises(CaseFailure, match="larger than a selected"):
        check_topk(x, 8, None, values, indices)


def test_checker_rejects_a_broken_order():
    x, values, indices = _good()
    values[0, :2], indices[0, :2] = values[0, :2].flip(0), indices[0, :2].flip(0)
    with pytest.raises(CaseFailure, match="non-increasing"):
        check_topk(x, 8, None, values, indices, sorted=True)


def test_checker_rejects_a_wrong_fill():
    x = randn(2, 3, seed=13)
    values, indices = topk(x, 5)
    indices[0, 4] = 0
    with pytest.raises(CaseFailure, match="idx_oob_fill_value"):
        check_topk(x, 5, None, values, indices)


# -- bad inputs ---------------------------------------------------------------------------------

X = randn(2, 16, seed=14)
END = torch.tensor([16, 3], dtype=torch.int32)
BAD = [
    ("input", dict(input=X.half())),
    ("input", dict(input=X.to(torch.int32))),
    ("input", dict(input=X[0])),
    ("input", dict(input=X[None])),
    ("input", dict(input=X.tolist())),
    ("topk", dict(topk=0)),
    ("topk", dict(topk=4097)),
    ("topk", dict(topk=True)),
    ("topk", dict(topk=2.0)),
    ("sorted", dict(sorted=1)),
    ("sorted_index", dict(sorted=True, sorted_index=True)),
    ("sorted_index", dict(sorted_index="yes")),
    ("begin", dict(begin=torch.zeros(2, dtype=torch.int32))),
    ("end", dict(end=END.long())),
    ("end", dict(end=END[:1])),
    ("end", dict(end=END[None])),
    ("end", dict(end=torch.tensor([17, 3], dtype=torch.int32))),
    ("end", dict(end=torch.tensor([-1, 3], dtype=torch.int32))),
    ("end", dict(end=END.to("meta"))),
    ("end", dict(end=[16, 3])),
    ("indices_type", dict(indices_type=torch.int16)),
    ("indices_type", dict(indices_type="int64")),
    ("idx_oob_fill_value", dict(indices_type=torch.int32, idx_oob_fill_value=2**31)),
    ("idx_oob_fill_value", dict(idx_oob_fill_value=-1.0)),
    ("value_oob_fill_value", dict(value_oob_fill_value="-inf")),
    ("return_value", dict(return_value=None)),
]


@pytest.mark.parametrize("arg,change", BAD, ids=[f"{a}-{i}" for i, (a, _) in enumerate(BAD)])
def test_bad_input_raises_contract_error_naming_the_argument(arg, change):
    kwargs = {"input": X, "topk": 4, **change}
    with pytest.raises(ContractError, match=f"argument '{arg}'"):
        topk(**kwargs)


def test_quick_conformance_passes_on_cpu():
    report = run_conformance(backend="cpu", ops=["topk"], quick=True)
    assert report.ok, report.format_table()
