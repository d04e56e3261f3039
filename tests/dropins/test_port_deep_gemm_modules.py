"""deep_gemm's module layout as a port imports it: `deep_gemm.utils.{math,layout,dist}`,
`deep_gemm.testing.{numeric,bench,utils}`, the runtime settings, `per_custom_dims_cast_to_fp8`."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

import portable_kernels as pk
from portable_kernels import deep_gemm
from portable_kernels.core.errors import ContractError
from portable_kernels.testing.ep_distributed import run_ranks

FP8_MAX = 448.0


@pytest.mark.parametrize("path", ["utils.math", "utils.layout", "utils.dist", "testing.numeric", "testing.bench",
                                  "testing.utils"])
def test_upstream_submodule_paths_import(path):
    module = importlib.import_module(f"portable_kernels.deep_gemm.{path}")
    for name in module.__all__:
        assert callable(getattr(module, name)), f"{path}.{name}"


def test_top_level_names_are_the_submodules_own():
    assert deep_gemm.utils.math.per_token_cast_to_fp8 is deep_gemm.per_token_cast_to_fp8
    assert deep_gemm.utils.per_block_cast_to_fp8 is deep_gemm.per_block_cast_to_fp8
    assert deep_gemm.utils.layout.get_mn_major_tma_aligned_tensor is deep_gemm.get_mn_major_tma_aligned_tensor
    assert deep_gemm.testing.calc_diff is deep_gemm.testing.numeric.calc_diff


@pytest.mark.parametrize("dims,use_ue8m0", [((0,), False), ((2, 0), True), ((1,), True), ((-1,), False)])
def test_per_custom_dims_cast_keeps_one_scale_per_kept_index(dims, use_ue8m0):
    torch.manual_seed(5)
    x = torch.randn(6, 5, 40) * torch.linspace(0.1, 30, 40)  # each kept index gets its own amax
    data, sf = deep_gemm.per_custom_dims_cast_to_fp8(x, dims, use_ue8m0)
    kept = sorted(d % 3 for d in dims)
    assert data.dtype == torch.float8_e4m3fn and data.shape == x.shape
    assert sf.dtype == torch.float32 and sf.shape == tuple(x.shape[d] for d in kept)
    reduce = [d for d in range(3) if d not in kept]
    amax = x.abs().amax(dim=reduce, keepdim=True).clamp(min=1e-4)
    full_sf = sf.view([x.shape[d] if d in kept else 1 for d in range(3)])
    if use_ue8m0:
        assert torch.equal(full_sf.log2(), full_sf.log2().round()), "ue8m0 scales are powers of two"
        assert bool((full_sf >= amax / FP8_MAX).all())
    else:
        torch.testing.assert_close(full_sf, amax / FP8_MAX)
    assert float(data.float().abs().max()) <= FP8_MAX
    assert pk.calc_diff(data.float() * full_sf, x) < 1e-3


def test_per_custom_dims_cast_bytes_are_the_per_token_casts_on_the_kept_rows():
    torch.manual_seed(6)
    x = torch.randn(8, 3, 256, dtype=torch.bfloat16)
    data, sf = deep_gemm.per_custom_dims_cast_to_fp8(x, (0, 1), False)
    flat_data, flat_sf = deep_gemm.per_token_cast_to_fp8(x.reshape(24, 256), False, gran_k=256)
    assert torch.equal(data.reshape(24, 256).view(torch.uint8), flat_data.view(torch.uint8))
    assert torch.equal(sf.reshape(24), flat_sf.reshape(24))


@pytest.mark.parametrize("dims", [(3,), (0, 0), ("0",)])
def test_per_custom_dims_cast_refuses_dims_it_cannot_keep(dims):
    with pytest.raises(ContractError, match="dims"):
        deep_gemm.per_custom_dims_cast_to_fp8(torch.randn(4, 8, 16), dims, False)


def test_assert_bitwise_equal_passes_equal_bytes_and_names_the_first_difference():
    torch.manual_seed(7)
    x = torch.randn(4, 6)
    deep_gemm.testing.assert_bitwise_equal(x, x.clone())
    y = x.clone()
    y[2, 3] = torch.nextafter(y[2, 3], torch.tensor(float("inf")))
    with pytest.raises(AssertionError, match=r"coord \(2, 3\)"):
        deep_gemm.testing.assert_bitwise_equal(x, y, "d")
    with pytest.raises(AssertionError, match="dtype"):
        deep_gemm.testing.assert_bitwise_equal(x, x.double())
    nan = torch.full((3,), float("nan"))
    deep_gemm.testing.assert_bitwise_equal(nan, nan.clone())  # bytes, not values: NaN equals itself


def test_bench_kineto_returns_seconds_per_name_and_one_under_nvidia_tools(monkeypatch):
    calls = []
    monkeypatch.delenv("DG_USE_NVIDIA_TOOLS", raising=False)
    single = deep_gemm.testing.bench_kineto(lambda: calls.append(1), "gemm", num_tests=4)
    pair = deep_gemm.testing.bench_kineto(lambda: calls.append(1), ("gemm", "reduce"), num_tests=3,
                                          suppress_kineto_output=True)
    assert isinstance(single, float) and single > 0 and len(pair) == 2 and pair[0] == pair[1] > 0
    assert len(calls) == (1 + 4) + (1 + 3)
    monkeypatch.setenv("DG_USE_NVIDIA_TOOLS", "1")
    assert deep_gemm.testing.bench_kineto(lambda: calls.append(1), ("a", "b")) == (1, 1)
    assert len(calls) == 9, "under NVIDIA tools fn is not run"
    with pytest.raises(TypeError, match="kernel_names"):
        deep_gemm.testing.bench_kineto(lambda: None, ["gemm"])
    assert deep_gemm.testing.bench(lambda: calls.append(1), num_warmups=2, num_tests=3) > 0


def test_test_filter_runs_or_skips_and_ignore_env_restores(monkeypatch, capsys):
    ran = []

    @deep_gemm.testing.test_filter(lambda: deep_gemm.testing.get_arch_major() == 9)
    def on_sm90():
        ran.append("sm90")

    @deep_gemm.testing.test_filter(lambda: deep_gemm.testing.get_arch_major() == 10)
    def on_sm100():
        ran.append("sm100")

    on_sm90()
    on_sm100()
    assert ran == ["sm90"] and "Filtered" in capsys.readouterr().out
    with pk.use_backend("nvidia", arch="sm100"):
        on_sm100()
    assert ran == ["sm90", "sm100"]

    monkeypatch.setenv("DG_JIT_USE_NVRTC", "1")
    seen = []

    @deep_gemm.testing.ignore_env("DG_JIT_USE_NVRTC", lambda: True)
    def body():
        seen.append(os.environ.get("DG_JIT_USE_NVRTC"))
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError):
        body()
    assert seen == [None] and os.environ["DG_JIT_USE_NVRTC"] == "1"


def test_runtime_settings_read_back_as_deep_gemm_and_nominal_sms_per_arch():
    deep_gemm.set_num_sms(0)  # another test may have left a count set, as DeepGEMM keeps it
    assert deep_gemm.get_num_sms() == 132
    with pk.use_backend("nvidia", arch="sm100"):
        assert deep_gemm.get_num_sms() == 148
        deep_gemm.set_num_sms(deep_gemm.get_num_sms() - 20)  # what DeepGEMM's tests do
        assert deep_gemm.get_num_sms() == 128
    assert deep_gemm.get_num_sms() == 128, "the count set stays set, as in DeepGEMM"
    deep_gemm.set_num_sms(0)
    assert deep_gemm.get_num_sms() == 132
    with pytest.raises(ContractError, match="new_num_sms"):
        deep_gemm.set_num_sms(133)
    deep_gemm.set_tc_util(60)
    assert deep_gemm.get_tc_util() == 60
    deep_gemm.set_tc_util(0)
    assert deep_gemm.get_tc_util() == 100
    with pytest.raises(ContractError, match="new_tc_util"):
        deep_gemm.set_tc_util(101)
    deep_gemm.set_pdl(True)
    assert deep_gemm.get_pdl() is True
    deep_gemm.set_pdl(False)
    deep_gemm.set_ignore_compile_dims(True)
    deep_gemm.set_block_size_multiple_of((64, 32))
    for bad in (0, 1.5, (64,), "64"):
        with pytest.raises(ContractError, match="new_value"):
            deep_gemm.set_block_size_multiple_of(bad)


def uneven_gather_body(rank, num_ranks, group):
    part = torch.arange(rank + 1, dtype=torch.float32).view(-1, 1).repeat(1, 3) + 10 * rank
    return deep_gemm.utils.uneven_all_gather(part, group=group)


def test_uneven_all_gather_concatenates_every_ranks_rows_in_rank_order():
    outcomes = run_ranks(2, uneven_gather_body, timeout_s=120)
    assert all(o.ok for o in outcomes), "\n".join(o.describe() for o in outcomes)
    expected = torch.cat([torch.arange(r + 1, dtype=torch.float32).view(-1, 1).repeat(1, 3) + 10 * r
                          for r in range(2)])
    for o in outcomes:
        assert torch.equal(o.value, expected)


def _indexer_call():
    from portable_kernels.testing.indexer_cases import cp_ranges, quantized_queries
    q = quantized_queries(8, 32, 64, seed=21)
    kv = deep_gemm.per_custom_dims_cast_to_fp8(torch.randn(64, 64, generator=torch.Generator().manual_seed(22)),
                                               (0,), False)
    weights = torch.randn(8, 32, generator=torch.Generator().manual_seed(23))
    return q, kv, weights, *cp_ranges(8, 64, True)


def test_mqa_logits_names_are_the_portable_op_under_deep_gemms_signatures():
    from portable_kernels.ops.attention.indexer import mqa_logits_reference
    q, kv, weights, ks, ke = _indexer_call()
    want = pk.fp8_mqa_logits(q, kv, weights, ks, ke)
    assert torch.equal(deep_gemm.fp8_mqa_logits(q, kv, weights, ks, ke), want)
    got = deep_gemm.fp8_fp4_mqa_logits((q, None), kv, weights, ks, ke, logits_dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.stride(0) * 2 % 1024 == 0
    valid = want != float("-inf")
    assert pk.calc_diff(got.float().masked_fill(~valid, 0), want.masked_fill(~valid, 0)) < 3e-5
    # FP4 q and keys, as DeepGEMM's SM100 test builds them: against the dequantized operands
    gen = torch.Generator().manual_seed(24)
    q_raw, k_raw = torch.randn(8, 32, 64, generator=gen), torch.randn(64, 64, generator=gen)
    q4 = deep_gemm.utils.per_token_cast_to_fp4(q_raw.view(-1, 64), use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    k4 = deep_gemm.utils.per_token_cast_to_fp4(k_raw, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    got = deep_gemm.fp8_fp4_mqa_logits((q4[0].view(8, 32, 32), q4[1].view(8, 32)), (k4[0], k4[1].view(64)), weights,
                                       ks, ke)
    q_sim = deep_gemm.utils.cast_back_from_fp4(*q4, gran_k=32, use_packed_ue8m0=True).view(8, 32, 64)
    k_sim = deep_gemm.utils.cast_back_from_fp4(*k4, gran_k=32, use_packed_ue8m0=True)
    want = mqa_logits_reference(q_sim, k_sim, weights, ks, ke)
    valid = want != float("-inf")
    assert torch.equal(got == float("-inf"), ~valid)
    assert pk.calc_diff(got.masked_fill(~valid, 0), want.masked_fill(~valid, 0)) < 1e-9
    with pytest.raises(ContractError, match="FP4 q takes FP4 keys"):
        deep_gemm.fp8_fp4_mqa_logits((q4[0].view(8, 32, 32), q4[1].view(8, 32)), kv, weights, ks, ke)


def test_paged_mqa_logits_legacy_form_and_metadata():
    from portable_kernels.testing.indexer_cases import build_indexer_cache, paged_context_lens, quantized_queries
    cache, table = build_indexer_cache((70, 9), 64, 64, seed=31)
    lens = paged_context_lens((70, 9), 2)
    q = quantized_queries(2, 2, 32, 64, seed=32)
    weights = torch.randn(4, 32, generator=torch.Generator().manual_seed(33))
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 64, deep_gemm.get_num_sms())
    assert meta.shape == (deep_gemm.get_num_sms() + 1, 2) and meta.dtype == torch.int32
    got = deep_gemm.fp8_paged_mqa_logits(q, cache, weights, lens, table, meta, 72)
    want = pk.fp8_paged_mqa_logits(q, cache, weights, lens, table, meta, 72)
    valid = torch.arange(72)[None, :] < lens.reshape(-1, 1)
    assert got.dtype == torch.float32 and torch.equal(got[valid], want[valid])


def _pow2_scales(rows, mn, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.exp2(torch.randint(-20, 10, (rows, mn), generator=g).float())


def _pack_group(sf_rows):
    """Reference: four consecutive K scales' exponent bytes per int32 word, zero bytes past the group."""
    n, mn = sf_rows.shape
    words = -(-n // 4)
    exps = torch.zeros(words * 4, mn, dtype=torch.int64)
    exps[:n] = (sf_rows.view(torch.int32) >> 23).long()
    packed = sum(exps[j::4] << (8 * j) for j in range(4))
    return packed.to(torch.uint32).view(torch.int32) if hasattr(torch, "uint32") else packed.to(torch.int32)


def test_k_grouped_packed_ue8m0_tensor_packs_each_groups_scales_on_their_own():
    ks = [256, 384, 128]                     # 2, 3, 1 scale rows of 128
    sf = _pow2_scales(6, 8, seed=41)
    layout = torch.tensor(ks, dtype=torch.int32)
    got = deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, layout, ks, 128, 128)
    want = torch.cat([_pack_group(sf[0:2]), _pack_group(sf[2:5]), _pack_group(sf[5:6])])
    assert got.dtype == torch.int32 and torch.equal(got, want)


def test_k_grouped_packed_ue8m0_tensor_psum_layout_and_its_upper_bound():
    real = [100, 300]                         # psum ends with K alignment 128: [100, 428]
    layout = torch.tensor([100, 128 + 300], dtype=torch.int32)
    sf = _pow2_scales(1 + 3, 8, seed=42)      # ceil(100/128) + ceil(300/128) rows
    want = torch.cat([_pack_group(sf[0:1]), _pack_group(sf[1:4])])
    exact = deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, layout, real, 128, 128, True)
    bound = deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, layout, None, 128, 128, True)
    assert torch.equal(exact, want) and bound.shape[0] == (4 + 3 * 2) // 4 and torch.equal(bound[:2], want)
    with pytest.raises(ContractError, match="ks_cpu"):
        deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf, layout, None, 128, 128, False)
    with pytest.raises(pk.LayoutError, match="power"):
        deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf * 3, layout, real, 128, 128, True)


def test_sm100_nt_takes_fp4_b_packed_along_n_as_deep_gemm():
    torch.manual_seed(8)
    x, w = torch.randn(32, 512, dtype=torch.bfloat16), torch.randn(64, 512, dtype=torch.bfloat16)
    with pk.use_backend("nvidia", arch="sm100"):
        a = deep_gemm.per_token_cast_to_fp8(x, use_ue8m0=True)
        b = deep_gemm.per_token_cast_to_fp4(w, use_ue8m0=True, gran_k=32)
        b_mn = (deep_gemm.transpose_packed_fp4(b[0]).T, b[1])   # DeepGEMM's MN-major FP4 operand
        assert b_mn[0].stride(0) == 1 and b_mn[0].shape == (32, 512)
        k_major, mn_major = (torch.full((32, 64), float("nan"), dtype=torch.bfloat16) for _ in range(2))
        deep_gemm.fp8_fp4_gemm_nt(a, b, k_major, recipe_a=(1, 128), recipe_b=(1, 32))
        deep_gemm.fp8_fp4_gemm_nt(a, b_mn, mn_major, recipe_a=(1, 128), recipe_b=(1, 32))
    assert torch.equal(k_major, mn_major)
    assert pk.calc_diff(mn_major, x.float() @ w.float().T) < 0.02


def test_skip_head_mid_places_each_heads_left_and_right_around_an_untouched_middle():
    torch.manual_seed(9)
    left, mid, right = 64, 32, 64
    heads, m, k = 3, 16, 256
    x, w = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(heads * (left + right), k, dtype=torch.bfloat16)
    a, b = deep_gemm.per_token_cast_to_fp8(x, use_ue8m0=False), deep_gemm.per_block_cast_to_fp8(w, use_ue8m0=False)
    d = torch.full((m, heads * (left + mid + right)), 7.0, dtype=torch.bfloat16)
    deep_gemm.fp8_gemm_nt_skip_head_mid(a, b, d, (left, mid, right), disable_ue8m0_cast=True)
    plain = torch.empty(m, heads * (left + right), dtype=torch.bfloat16)
    deep_gemm.fp8_gemm_nt(a, b, plain, disable_ue8m0_cast=True)
    placed, computed = d.view(m, heads, -1), plain.view(m, heads, -1)
    assert torch.equal(placed[:, :, :left], computed[:, :, :left])
    assert torch.equal(placed[:, :, left + mid:], computed[:, :, left:])
    assert bool((placed[:, :, left:left + mid] == 7).all()), "the middle columns are not written"
    with pytest.raises(ContractError, match="'d'"):
        deep_gemm.fp8_gemm_nt_skip_head_mid(a, b, d[:, :-1].contiguous(), (left, mid, right))
    with pytest.raises(ContractError, match="head_splits"):
        deep_gemm.fp8_gemm_nt_skip_head_mid(a, b, d, (left, mid))
