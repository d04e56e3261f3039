"""The FP8 KV cache in the ascend backend's Format: prepared (or allocated and written) once, decoded
with no conversion on the 950 stand-in; a cache in the wrong order is converted in the call and
counted (strict mode refuses it). Proves the documented calls, not the NPU's numbers."""

import pytest
import torch

import portable_kernels as pk
from ascend_stub import make_stand_in
from portable_kernels.backends.ascend.vendor import runtime
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.flash_mla import quantize_k_cache
from portable_kernels.layouts import ASCEND_BF16_KV, ASCEND_FP8_KV, FLASHMLA_FP8_KV
from portable_kernels.ops.attention.decode import HEAD_DIM_V, mla_decode_reference
from portable_kernels.testing.generators import randn
from portable_kernels.testing.mla_cases import build_paged_cache, check_decode, random_indices, random_kv

OP = "flash_mla_with_kvcache"
SCALE = 576 ** -0.5


def _case(soc="950", seed=0):
    paged = build_paged_cache(random_kv((70, 5, 130), 1, 576, seed=seed), 64, seed=seed, fp8=True)
    q = randn(3, 1, 16, 576, seed=seed + 1, dtype=torch.bfloat16)
    return paged, q


def _decode(q, paged, k_cache):
    meta, splits = pk.get_mla_metadata(paged.cache_seqlens, 16, 1, is_fp8_kvcache=True)
    return pk.flash_mla_with_kvcache(q, k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, meta, splits,
                                     is_fp8_kvcache=True)


def _reference(q, paged):
    return mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, SCALE, False,
                                True, None, dtype=torch.float64)


@pytest.fixture
def ascend950():
    with runtime.use_stand_in(make_stand_in("950")), pk.use_backend("ascend", soc="950"):
        yield


def test_prepare_converts_the_cache_once_into_cann_order(ascend950):
    paged, _ = _case()
    cache = pk.prepare_inputs(OP, k_cache=paged.k_cache)["k_cache"]
    assert isinstance(cache, pk.PreparedKVCache) and cache.format is ASCEND_FP8_KV and cache.backend == "ascend"
    assert torch.equal(cache.data, ASCEND_FP8_KV.encode(paged.k_cache))


def test_a_prepared_cache_decodes_with_no_conversion_on_950(ascend950):
    paged, q = _case()
    cache = pk.prepare_inputs(OP, k_cache=paged.k_cache)["k_cache"]
    with pk.count_implicit_conversions() as n, trace_providers() as ran:
        out, lse = _decode(q, paged, cache)
    assert n.count == 0
    assert ran[-1] == (OP, "ascend", "torch_npu-kvquant-sfa")
    check_decode(out, lse, *_reference(q, paged))


def test_a_flashmla_order_cache_on_950_is_one_counted_conversion(ascend950):
    paged, q = _case(seed=3)
    with pk.count_implicit_conversions() as n, pytest.warns(pk.ImplicitConversionWarning, match="k_cache"):
        out, lse = _decode(q, paged, paged.k_cache)
    assert n.count == 1
    check_decode(out, lse, *_reference(q, paged))


def test_strict_layouts_refuses_a_cache_in_the_wrong_order(ascend950):
    paged, q = _case()
    with pk.strict_layouts(), pytest.raises(pk.LayoutError, match="k_cache"):
        _decode(q, paged, paged.k_cache)


def test_a_cann_order_cache_under_the_cpu_backend_is_converted_back_and_counted():
    paged, q = _case(seed=5)
    with pk.use_backend("ascend", soc="950"):
        cache = pk.prepare_inputs(OP, k_cache=paged.k_cache)["k_cache"]
    with pk.use_backend("cpu"), pk.count_implicit_conversions() as n:
        out, lse = _decode(q, paged, cache)
    assert n.count == 1
    check_decode(out, lse, *_reference(q, paged))


def test_a_prepared_cache_selects_its_backend_by_its_tag():
    paged, q = _case(seed=6)
    cache = pk.prepare_inputs(OP, k_cache=paged.k_cache, backend="ascend")["k_cache"]
    with runtime.use_stand_in(make_stand_in("950")), trace_providers() as ran, pk.count_implicit_conversions() as n:
        meta, splits = pk.get_mla_metadata(paged.cache_seqlens, 16, 1, is_fp8_kvcache=True)
        with pytest.raises(pk.ContractError, match="tile_scheduler_metadata"):  # metadata of the cpu backend
            pk.flash_mla_with_kvcache(q, cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, meta, splits,
                                      is_fp8_kvcache=True)
        with pk.use_backend("ascend"):
            meta, splits = pk.get_mla_metadata(paged.cache_seqlens, 16, 1, is_fp8_kvcache=True)
        out, lse = pk.flash_mla_with_kvcache(q, cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, meta,
                                             splits, is_fp8_kvcache=True)
    assert n.count == 0 and ran[-1] == (OP, "ascend", "torch_npu-kvquant-sfa")
    check_decode(out, lse, *_reference(q, paged))


@pytest.mark.parametrize("soc,fmt", [("950", ASCEND_FP8_KV), ("910b", ASCEND_BF16_KV), ("910c", ASCEND_BF16_KV)])
def test_written_pages_equal_a_converted_flashmla_cache(soc, fmt):
    kv = randn(2, 64, 1, 576, seed=7, dtype=torch.bfloat16)
    cache = pk.allocate_kv_cache(3, backend="ascend", options={"soc": soc})
    assert cache.format is fmt
    blocks = torch.tensor([2] * 64 + [0] * 64)
    offsets = torch.arange(128) % 64
    pk.write_kv_cache(cache, blocks, offsets, kv.view(128, 576))
    flashmla = torch.zeros(3, 64, 1, 656, dtype=torch.uint8)
    flashmla[[2, 0]] = quantize_k_cache(kv).view(torch.uint8)
    assert torch.equal(cache.data, fmt.encode(flashmla))


@pytest.mark.parametrize("soc", ["910b", "910c"])
def test_a2a3_prepare_stores_the_exact_values_once(soc):
    paged, _ = _case(seed=8)
    with pk.use_backend("ascend", soc=soc):
        cache = pk.prepare_inputs(OP, k_cache=paged.k_cache)["k_cache"]
    assert cache.format is ASCEND_BF16_KV and cache.data.dtype == torch.bfloat16
    assert tuple(cache.data.shape) == (*paged.k_cache.shape[:3], 576)
    # unused slots hold NaN (the conformance builder's trap): compare bit for bit
    assert torch.equal(cache.data.view(torch.int16), FLASHMLA_FP8_KV.dequantize(paged.k_cache).view(torch.int16))


@pytest.mark.parametrize("sparse", [False, True])
def test_a2a3_decode_a_prepared_cache_converting_nothing(sparse):
    paged, q = _case(seed=9)
    with runtime.use_stand_in(make_stand_in("910b")), pk.use_backend("ascend", soc="910b"):
        cache = pk.prepare_inputs(OP, k_cache=paged.k_cache)["k_cache"]
        indices = random_indices(paged, 1, 32, seed=10)[0] if sparse else None
        meta, splits = pk.get_mla_metadata(paged.cache_seqlens, 16, 1, num_heads_q=16 if sparse else None,
                                           is_fp8_kvcache=True, topk=32 if sparse else None)
        with pk.count_implicit_conversions() as n, trace_providers() as ran:
            out, lse = pk.flash_mla_with_kvcache(q, cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, meta,
                                                 splits, is_fp8_kvcache=True, indices=indices)
    assert n.count == 0
    assert ran[-1] == (OP, "ascend", "torch_npu-sfa" if sparse else "torch_npu-fia")
    check_decode(out, lse, *mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens,
                                                 HEAD_DIM_V, SCALE, False, True, indices, dtype=torch.float64))


def test_a2a3_provider_receives_the_values_storage_as_is(monkeypatch):
    # what the provider is handed: the prepared bf16 rows themselves (no copy, no repack before it)
    from portable_kernels.backends.ascend.vendor import mla as npu_mla
    paged, q = _case(seed=11)
    seen, real = [], npu_mla.dense_decode_fused_infer

    def spy(npu, q_, k_cache, *args, **kwargs):
        seen.append((k_cache, kwargs.get("cache_format")))
        return real(npu, q_, k_cache, *args, **kwargs)

    monkeypatch.setattr(npu_mla, "dense_decode_fused_infer", spy)
    with runtime.use_stand_in(make_stand_in("910b")), pk.use_backend("ascend", soc="910b"):
        cache = pk.prepare_inputs(OP, k_cache=paged.k_cache)["k_cache"]
        _decode(q, paged, cache)
    assert len(seen) == 1 and seen[0][0] is cache.data and seen[0][1] is ASCEND_BF16_KV


def test_a_flashmla_cache_on_a2a3_is_one_counted_conversion():
    paged, q = _case(seed=12)
    with runtime.use_stand_in(make_stand_in("910b")), pk.use_backend("ascend", soc="910b"):
        with pk.count_implicit_conversions() as n, trace_providers() as ran:
            out, lse = _decode(q, paged, paged.k_cache)
    assert n.count == 1 and ran[-1] == (OP, "ascend", "torch_npu-fia")
    check_decode(out, lse, *_reference(q, paged))
