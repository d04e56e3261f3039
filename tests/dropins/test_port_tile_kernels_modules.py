"""tile_kernels' module layout as a port imports it: `modeling.mhc.ops` (and each op module), `moe.scoring` (ScoringFunc, taken by the gate),
`config`'s nominal SM count per emulated arch, `utils`, `quant.common` and the `testing` helpers
TileKernels' tests import, each held to upstream's behaviour on small seeded cases."""

from __future__ import annotations

import importlib
import random

import pytest
import torch

import portable_kernels as pk
from portable_kernels import tile_kernels
from portable_kernels.core.errors import ContractError
from portable_kernels.tile_kernels import config
from portable_kernels.tile_kernels.moe.scoring import ScoringFunc
from portable_kernels.tile_kernels.testing import bench, generator, numeric

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device reports its own SM count")

SUBMODULES = ["moe", "moe.scoring", "quant", "quant.common", "quant.types", "transpose", "config", "utils", "testing",
              "testing.numeric", "testing.bench", "testing.generator", "testing.quant",
              "mhc", "mhc.post_kernel", "mhc.multilayer_recompute_kernel", "modeling", "modeling.mhc",
              "modeling.mhc.functional", "modeling.mhc.ops",
              *(f"modeling.mhc.ops.{m}" for m in ("expand", "head_compute_mix", "multilayer_recompute", "norm_fn",
                                                  "post", "pre_apply_mix", "pre_big_fuse", "pre_split_mixes",
                                                  "sinkhorn"))]

# every `from tile_kernels.X import ...` of TileKernels' tests and oracles in scope (36d9e45)
UPSTREAM_IMPORTS = {
    "config": ["set_num_sms", "get_num_sms", "get_device_num_sms"],
    "moe.scoring": ["ScoringFunc"],
    "quant.common": ["unpack_from_e2m1fn_x2"],
    "quant.types": ["QuantTensor"],
    "utils": ["align", "ceil_div", "is_power_of_two"],
    "testing": ["clear_unused_sf"],
    "testing.bench": ["make_param_id", "make_param_key", "dtype_to_str"],
    "testing.numeric": ["assert_equal", "calc_diff", "count_bytes", "check_bias"],
    "testing.generator": ["generate_hidden_sizes", "generate_num_tokens", "generate_topk_idx", "generate_moe_params",
                          "generate_num_sms", "generate_e5m6_inputs", "generate_rand_float"],
    "testing.quant": ["clear_unused_sf"],
    "modeling.mhc.ops": ["expand_to_mhc", "mhc_head_compute_mix", "mhc_pre_norm_fn", "mhc_post", "mhc_pre_apply_mix",
                         "mhc_pre_big_fuse", "mhc_pre_split_mixes", "sinkhorn_normalize"],
    "modeling.mhc.ops.multilayer_recompute": ["mhc_multilayer_recompute"],
    "modeling.mhc.ops.post": ["mhc_post"],
    "modeling.mhc.ops.pre_apply_mix": ["mhc_pre_apply_mix"],
}

# the names tile_kernels.moe exported while it was one module; they must stay importable
MOE_NAMES = ["aux_fi", "expand_to_fused", "expand_to_fused_with_sf", "get_fused_mapping", "group_count",
             "inplace_unique_group_indices", "mask_indices_by_tp", "normalize_weight", "reduce_fused", "top2_sum_gate",
             "topk_gate", "topk_sum_and_topk_group_idx"]


@pytest.fixture
def restore_num_sms():
    saved = config._num_sms
    yield
    config._num_sms = saved


# ------------------------------------------------------------------------------------------ layout


@pytest.mark.parametrize("path", SUBMODULES)
def test_upstream_submodule_path_imports(path):
    module = importlib.import_module(f"portable_kernels.tile_kernels.{path}")
    for name in getattr(module, "__all__", ()):
        assert hasattr(module, name), f"{path}.{name}"


@pytest.mark.parametrize("path", sorted(UPSTREAM_IMPORTS))
def test_names_upstream_tests_import_resolve(path):
    module = importlib.import_module(f"portable_kernels.tile_kernels.{path}")
    missing = [name for name in UPSTREAM_IMPORTS[path] if not hasattr(module, name)]
    assert not missing


def test_moe_package_keeps_every_name_of_the_former_module():
    from portable_kernels.tile_kernels import moe
    assert sorted(set(MOE_NAMES) - set(moe.__all__)) == []
    assert moe.topk_gate is pk.ops.moe_routing.topk_gate
    assert moe.scoring.ScoringFunc is moe.ScoringFunc is ScoringFunc


def test_package_attributes_are_the_submodules():
    assert tile_kernels.testing.clear_unused_sf is tile_kernels.testing.quant.clear_unused_sf
    assert tile_kernels.quant.common.unpack_from_e2m1fn_x2 is tile_kernels.quant.unpack_from_e2m1fn_x2
    assert tile_kernels.get_device_num_sms is config.get_device_num_sms


# ------------------------------------------------------------------------------------- ScoringFunc


def test_scoring_func_members_have_upstream_values():
    assert [(m.name, int(m)) for m in ScoringFunc] == [("SIGMOID", 0), ("SQRTSOFTPLUS", 1), ("SOFTMAX", 2),
                                                       ("IDENTITY", 3)]


def test_scoring_func_str_is_the_lower_case_name():
    assert [str(m) for m in ScoringFunc] == ["sigmoid", "sqrtsoftplus", "softmax", "identity"]


@pytest.mark.parametrize("label,member", [("sigmoid", ScoringFunc.SIGMOID), ("SqrtSoftplus", ScoringFunc.SQRTSOFTPLUS),
                                          ("SOFTMAX", ScoringFunc.SOFTMAX), ("identity", ScoringFunc.IDENTITY)])
def test_scoring_func_from_str_reads_any_case(label, member):
    assert ScoringFunc.from_str(label) is member


@pytest.mark.parametrize("label", ["relu", "", "soft max", 2])
def test_scoring_func_from_str_refuses_unknown_labels_as_value_error(label):
    with pytest.raises(ValueError, match="not a valid ScoringFunc"):
        ScoringFunc.from_str(label)


def _gate_case(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(24, 64, generator=g), torch.randn(64, generator=g)


def _gate(logits: torch.Tensor, bias: torch.Tensor, scoring_func) -> tuple[torch.Tensor, torch.Tensor]:
    return tile_kernels.moe.top2_sum_gate(logits, bias, 6, 4, 8, False, 0, 2.5, 0, 1, 0, 1, scoring_func)


@pytest.mark.parametrize("member", [m for m in ScoringFunc if m is not ScoringFunc.IDENTITY], ids=str)
def test_gate_given_a_scoring_member_gives_the_bytes_of_its_name(member):
    logits, bias = _gate_case(int(member))
    by_name, by_member = _gate(logits, bias, str(member)), _gate(logits, bias, member)
    upper = _gate(logits, bias, str(member).upper())
    for want, got in ((by_name, by_member), (by_name, upper)):
        assert torch.equal(want[0], got[0])
        assert torch.equal(want[1].view(torch.int32), got[1].view(torch.int32))


def test_gate_refuses_identity_scoring_as_upstream():
    logits, bias = _gate_case(3)
    for value in (ScoringFunc.IDENTITY, "identity"):
        with pytest.raises(ContractError, match="'scoring_func'.*identity"):
            _gate(logits, bias, value)


@pytest.mark.parametrize("value", ["relu", 0, None])
def test_gate_refuses_other_scoring_values_with_the_contract_error(value):
    logits, bias = _gate_case(4)
    with pytest.raises(ContractError, match="'scoring_func'"):
        _gate(logits, bias, value)


# ------------------------------------------------------------------------------------------ config


@no_cuda
def test_device_num_sms_is_the_nominal_sm90_count():
    assert config.get_device_num_sms() == 132
    assert generator.generate_num_sms() == [112, 132]


@no_cuda
def test_device_num_sms_follows_the_emulated_sm100():
    with pk.use_backend("nvidia", arch="sm100"):
        assert tile_kernels.get_device_num_sms() == 148
    assert tile_kernels.get_device_num_sms() == 132


@no_cuda
def test_set_num_sms_takes_upstream_arithmetic_and_checks_the_arch_count(restore_num_sms):
    with pk.use_backend("nvidia", arch="sm100"):
        config.set_num_sms(config.get_device_num_sms() - 20)
        assert config.get_num_sms() == 128
        config.set_num_sms(148)
    with pytest.raises(ContractError, match="'num_sms'.*132"):
        config.set_num_sms(148)
    with pytest.raises(ContractError, match="'num_sms'"):
        config.set_num_sms(0)


# ------------------------------------------------------------------------------------------- utils


def test_utils_round_up_and_detect_powers_of_two():
    u = tile_kernels.utils
    assert [u.ceil_div(x, 4) for x in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
    assert [u.align(x, 64) for x in (1, 64, 65, 576)] == [64, 64, 128, 576]
    assert [x for x in range(-2, 70) if u.is_power_of_two(x)] == [1, 2, 4, 8, 16, 32, 64]


# ------------------------------------------------------------------------------- testing.numeric


def test_assert_equal_passes_equal_bytes_including_equal_nans():
    torch.manual_seed(11)
    x = torch.randn(5, 7)
    x[1, 2] = float("nan")
    numeric.assert_equal(x, x.clone())


def test_assert_equal_names_a_one_ulp_difference():
    torch.manual_seed(12)
    x = torch.randn(5, 7)
    y = x.clone()
    y[3, 4] = torch.nextafter(y[3, 4], torch.tensor(float("inf")))
    with pytest.raises(AssertionError, match=r"values are not equal(.|\n)*\[\[3, 4\]\]"):
        numeric.assert_equal(x, y)


def test_assert_equal_tells_signed_zeros_apart():
    torch.manual_seed(13)
    x = torch.randn(8)
    x[5] = 0.0
    y = x.clone()
    y[5] = -0.0
    with pytest.raises(AssertionError, match="values"):
        numeric.assert_equal(x, y)


def test_assert_equal_checks_dtype_shape_and_strides_unless_told_not_to():
    torch.manual_seed(14)
    x = torch.randn(6, 4)
    with pytest.raises(AssertionError, match="dtypes"):
        numeric.assert_equal(x, x.double())
    with pytest.raises(AssertionError, match="shapes"):
        numeric.assert_equal(x, x.reshape(4, 6))
    column_major = x.t().contiguous().t()
    with pytest.raises(AssertionError, match="strides"):
        numeric.assert_equal(x, column_major)
    numeric.assert_equal(x, column_major, check_stride=False)


def test_calc_diff_is_one_minus_the_similarity_in_float64():
    torch.manual_seed(15)
    x = torch.randn(64, 32)
    diff = numeric.calc_diff(x, 2 * x)  # 2·Σ2x² / Σ5x² = 0.8
    assert diff.dtype == torch.float64 and diff.dim() == 0
    assert abs(float(diff) - 0.2) < 1e-12
    assert float(numeric.calc_diff(x, x)) < 1e-15


def test_calc_diff_of_two_empty_signals_is_zero():
    assert numeric.calc_diff(torch.zeros(4), torch.zeros(4)) == 0


def test_check_bias_accepts_round_to_nearest_and_refuses_floor():
    torch.manual_seed(16)
    ref = torch.randn(4096)
    numeric.check_bias(ref.bfloat16().float(), ref)
    with pytest.raises(AssertionError, match="ratio not close to 0.5"):
        numeric.check_bias(ref.bfloat16().float().floor(), ref)
    numeric.check_bias(torch.empty(0), torch.empty(0))


def test_count_bytes_walks_pairs_and_skips_none():
    torch.manual_seed(17)
    data, sf = torch.randn(4, 128).to(torch.float8_e4m3fn), torch.rand(4, 1)
    assert numeric.count_bytes(torch.randn(3, 5, dtype=torch.bfloat16), (data, sf), None, [sf, [sf]]) == \
        30 + 512 + 16 + 16 + 16


# --------------------------------------------------------------------------------- testing.bench


def test_dtype_to_str_names_the_kernel_dtypes_and_refuses_others():
    assert [bench.dtype_to_str(d) for d in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int8)] == \
        ["fp32", "bf16", "e4m3", "e2m1"]
    with pytest.raises(ValueError, match="'dtype'"):
        bench.dtype_to_str(torch.float16)


def test_make_param_id_joins_formatted_values():
    params = {"num_tokens": 4001, "dtype": torch.bfloat16, "shape": (2, 64), "sf": None, "round_sf": True}
    assert bench.make_param_id(params) == "num_tokens=4001-dtype=bf16-shape=2x64-sf=None-round_sf=True"
    assert bench.make_param_id({}) == "default"


def test_make_param_key_shortens_pads_and_drops_none():
    params = {"num_tokens": 37, "num_ep_ranks": 8, "hidden": 576, "use_packed_ue8m0": True, "sf": None,
              "fmt": "e4m3"}
    assert bench.make_param_key(params) == "num_tokens=   37,ep= 8,hidden= 576,ue8m0=1,fmt=e4m3"


def test_print_average_perf_prints_geometric_means(capsys):
    bench.print_average_perf([2.0, 8.0], [100.0, 400.0], [])
    bench.print_average_perf([], [], [])
    assert capsys.readouterr().out.splitlines() == [
        "Average Performance: 4.0 us, 200 GB/s, 1.00x speedup", "Empty latency_list and bandwidth_list"]


def test_suppress_stdout_stderr_silences_and_restores(capfd):
    with bench.suppress_stdout_stderr():
        print("hidden")
    with bench.empty_suppress():
        print("shown")
    assert capfd.readouterr().out == "shown\n"


# ----------------------------------------------------------------------------- testing.generator


def test_token_and_hidden_grids_follow_upstream(monkeypatch):
    monkeypatch.delenv("TK_FULL_TEST", raising=False)
    assert generator.generate_num_tokens() == [4001, 8001]
    assert generator.generate_num_tokens(64) == [4032, 8064]
    assert generator.generate_hidden_sizes(1024) == [2048, 3072, 4096, 6144, 7168]
    monkeypatch.setenv("TK_FULL_TEST", "1")
    assert generator.generate_num_tokens() == [0, 4001, 8001]
    assert generator.generate_num_tokens(is_benchmark=True) == [4001, 8001]
    assert generator.generate_num_sms()[0] == 1


def test_moe_grid_splits_experts_evenly_over_ranks(monkeypatch):
    monkeypatch.delenv("TK_FULL_TEST", raising=False)
    grid = list(generator.generate_moe_params())
    assert len(grid) == 12
    assert {(p["num_experts"] * p["num_ep_ranks"], p["num_ep_ranks"]) for p in grid} == {(72, 8), (256, 8), (256, 64)}
    monkeypatch.setenv("TK_FULL_TEST", "1")
    assert next(generator.generate_moe_params())["num_send_tokens"] == 0


def test_topk_idx_keeps_local_experts_and_drops_unrouted_tokens():
    torch.manual_seed(18)
    params = {"num_send_tokens": 50, "num_topk": 6, "num_experts": 9, "num_ep_ranks": 8}
    idx = generator.generate_topk_idx(params)
    assert idx.dtype == torch.int64 and idx.shape[1] == 6 and 0 < idx.shape[0] < 400
    assert bool(((idx >= -1) & (idx < 9)).all()) and bool((idx >= 0).any(dim=1).all())
    for row in idx.tolist():
        local = [e for e in row if e >= 0]
        assert len(local) == len(set(local))
    empty = generator.generate_topk_idx({**params, "num_send_tokens": 0})
    assert empty.shape == (0, 6) and empty.dtype == torch.int64


def test_e5m6_inputs_yield_random_then_special_tensors():
    torch.manual_seed(19)
    cases = list(generator.generate_e5m6_inputs(3, 8, torch.float32))
    assert [special for _, special in cases] == [False, True, True, True]
    assert [float(x[0, 0]) for x, _ in cases[1:]] == [2.0 ** -20, 2.0 ** -14 * 63 / 64, 2.0 ** -14]
    assert all(float(x[2, -1]) == 65024.0 for x, _ in cases[1:])


def test_rand_float_is_finite_and_clamped_at_any_exponent():
    random.seed(20)
    torch.manual_seed(20)
    x = generator.generate_rand_float((64, 64))
    assert x.dtype == torch.float32 and bool(torch.isfinite(x).all())
    big = generator.generate_rand_float((64, 64), exponent=126)
    assert bool(torch.isfinite(big).all()) and float(big.abs().max()) == torch.finfo(torch.float32).max / 8


# --------------------------------------------------------------------------------- testing.quant


def test_clear_unused_sf_zeroes_padding_bytes_in_place():
    g = torch.Generator().manual_seed(21)
    sf = torch.randint(1, 255, (6, 8), dtype=torch.uint8, generator=g).view(torch.int32)  # 6 rows of 2 words
    before = sf.clone().view(torch.uint8)
    out = tile_kernels.testing.clear_unused_sf(sf, 640, 128)  # 5 scales per row, 3 padding bytes
    assert out.dtype == torch.uint8 and out.shape == (6, 8)
    assert torch.equal(out[:, :5], before[:, :5]) and bool((out[:, 5:] == 0).all())
    assert torch.equal(sf.view(torch.uint8), out)
