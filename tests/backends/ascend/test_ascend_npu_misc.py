"""Top-k and MoE gate providers, chip detection and the torch_npu runtime accessor of the ascend backend."""

import importlib.metadata
import importlib.util

import pytest
import torch

import ascend_stub
from ascend_stub import StandInError, make_stand_in
from portable_kernels.backends.ascend import chips
from portable_kernels.backends.ascend.vendor import moe as npu_moe, topk as npu_topk, runtime
from portable_kernels.ops.moe_routing import top2_sum_gate_reference
from portable_kernels.testing.generators import randn
from portable_kernels.ops.topk import topk_reference


def _check_topk_properties(x, k, end, values, indices, sorted_, sorted_index, fill_idx, fill_val):
    b, n = x.shape
    for i in range(b):
        length = n if end is None else int(end[i])
        count = min(k, length)
        idx = indices[i, :count].long()
        assert len(set(idx.tolist())) == count and bool(((idx >= 0) & (idx < length)).all())
        assert torch.equal(values[i, :count], x[i, idx])
        assert indices[i, count:].eq(fill_idx).all() and values[i, count:].float().eq(fill_val).all()
        rest = torch.ones(length, dtype=torch.bool)
        rest[idx] = False
        if count and bool(rest.any()):
            assert float(x[i, idx].float().min()) >= float(x[i, :length][rest].float().max())
        if sorted_:
            assert bool((values[i, :count].float().diff() <= 0).all())
        if sorted_index:
            assert bool((idx.diff() > 0).all())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sorted_,sorted_index", [(False, False), (True, False), (False, True)])
def test_topk_select_keeps_the_contract(seed, dtype, sorted_, sorted_index):
    b, n, k = 5, 300, 37
    x = randn(b, n, seed=seed, dtype=dtype)
    x[0, :10] = float("-inf")  # -inf values are ordinary values
    x[1, 5:50] = 0.25  # ties
    end = torch.tensor([300, 20, 0, 37, 5], dtype=torch.int32) if seed % 2 else None
    values, indices = npu_topk.topk_select(x, k, end, sorted_, sorted_index, torch.int32, -7, -1.5, True)
    assert values.dtype == dtype and indices.dtype == torch.int32 and values.shape == (b, k)
    _check_topk_properties(x, k, end, values, indices, sorted_, sorted_index, -7, -1.5)


def test_topk_select_valid_minus_inf_beats_positions_past_end():
    x = torch.tensor([[float("-inf"), float("-inf"), 1.0, 5.0]])
    end = torch.tensor([2], dtype=torch.int32)
    _, idx = npu_topk.topk_select(x, 2, end, False, False, torch.int64, 2**31 - 1, float("-inf"), True)
    assert sorted(idx[0].tolist()) == [0, 1]


def test_topk_select_topk_larger_than_n_fills():
    x = randn(2, 3, seed=1)
    values, indices = npu_topk.topk_select(x, 5, None, True, False, torch.int64, -1, 0.0, True)
    ref_values, _ = topk_reference(x, 5, sorted=True, idx_oob_fill_value=-1, value_oob_fill_value=0.0)
    assert torch.equal(values, ref_values) and indices[:, 3:].eq(-1).all()


@pytest.mark.parametrize("experts,groups,kept,k", [(256, 8, 4, 8), (64, 0, 0, 6), (96, 4, 4, 5)])
def test_sigmoid_gate_matches_the_contract(experts, groups, kept, k):
    npu = make_stand_in("910c")
    logits = randn(33, experts, seed=experts)
    bias = randn(experts, seed=1, scale=0.1)
    mask = torch.ones(33, dtype=torch.bool)
    mask[4] = False
    idx, weights = npu_moe.sigmoid_top2_sum_gate(npu, logits, bias, k, kept, groups, 2.5, mask)
    ref_idx, ref_w = top2_sum_gate_reference(logits, bias, k, kept, groups, 2.5, "sigmoid", True, mask)
    assert torch.equal(idx, ref_idx)
    assert torch.allclose(weights, ref_w, rtol=1e-6, atol=1e-7)
    assert npu.calls == ["npu_moe_gating_top_k"]


def test_gate_limits_follow_the_cann_constraints():
    assert npu_moe.gate_limits_reason(256, 8) is None
    assert "2048" in npu_moe.gate_limits_reason(4096, 8)
    assert "more than 2" in npu_moe.gate_limits_reason(16, 8)
    assert "align32" in npu_moe.gate_limits_reason(2040, 60)


def test_gate_is_not_documented_on_950():
    with pytest.raises(StandInError, match="A2/A3 only"):
        npu_moe.sigmoid_top2_sum_gate(make_stand_in("950"), randn(2, 64, seed=1), None, 2, 0, 0, 1.0, None)


# -- chips and runtime ---------------------------------------------------------------------------------

@pytest.mark.parametrize("version,chip", [(220, "910b"), (225, "910b"), (250, "910c"), (255, "910c"), (260, "950"),
                                          (202, None), (104, None)])
def test_chip_from_soc_version(version, chip):
    assert chips.chip_from_soc_version(version) == chip


@pytest.mark.parametrize("name,chip", [("Ascend910B3", "910b"), ("Ascend910_9382", "910c"), ("Ascend950PR", "950"),
                                       ("Ascend910_9591", "950"), ("Ascend310P3", None)])
def test_chip_from_device_name(name, chip):
    assert chips.chip_from_device_name(name) == chip


@pytest.mark.parametrize("soc", ["910b", "910c", "950"])
def test_detect_chip_reads_the_stand_in(soc):
    assert chips.detect_chip(make_stand_in(soc)) == soc


def test_check_chip_refuses_unknown_names():
    with pytest.raises(ValueError, match="910b"):
        chips.check_chip("910")


def test_runtime_has_no_torch_npu_here_and_says_why():
    assert runtime.torch_npu() is None
    assert "torch_npu is not installed" in runtime.native_unavailable_reason()


def test_use_stand_in_routes_provider_calls_and_is_undone():
    stand_in = make_stand_in("950")
    with runtime.use_stand_in(stand_in):
        assert runtime.torch_npu() is stand_in and runtime.native_unavailable_reason() is None
    assert runtime.torch_npu() is None


def test_has_argument_reads_the_signature():
    assert runtime.has_argument(make_stand_in("950"), "npu_dynamic_mx_quant", "max_low_bound")
    assert not runtime.has_argument(make_stand_in("950", with_max_low_bound=False), "npu_dynamic_mx_quant",
                                    "max_low_bound")
    assert not runtime.has_argument(make_stand_in("950"), "npu_no_such_op", "x")


def test_stand_in_is_never_visible_as_torch_npu():
    assert importlib.util.find_spec("torch_npu") is None
    assert ascend_stub.__name__ != "torch_npu"
    names = [ep.name for ep in importlib.metadata.entry_points(group="torch.backends")]
    assert "torch_npu" not in names and "ascend_stub" not in names
