"""Lightning indexer on the ascend backend: the logits providers (torch ops torch_npu runs) pass the
quick conformance on the stand-in for every chip, decline with reasons without torch_npu, and the
fused mapping `lightning_indexer_topk` (npu_quant_lightning_indexer, Ascend 950) agrees with our
reference logits + top-k on the documented-semantics stand-in. Nothing here ran on an NPU.
"""

import pytest
import torch

from ascend_stub import StandInError, make_stand_in
from portable_kernels.backends.ascend.vendor import indexer as npu_indexer, runtime
from portable_kernels.core.registry import available_backends
from portable_kernels.layouts.indexer_cache import dequantize_indexer_cache, indexer_cache_views
from portable_kernels.ops.attention.indexer import MqaLogitsInputs, paged_mqa_logits_reference
from portable_kernels.ops.topk import topk_reference
from portable_kernels.testing import run_conformance
from portable_kernels.testing.generators import randn
from portable_kernels.testing.indexer_cases import build_indexer_cache, paged_context_lens, quantized_queries

OPS = ("fp8_mqa_logits", "fp8_paged_mqa_logits")


def _provider(op: str, name: str = "torch_npu"):
    return next(p for p in available_backends()["ascend"].details[op] if p.name == name)


@pytest.mark.parametrize("soc", ["950", "910b", "910c"])
def test_quick_conformance_is_served_by_the_torch_npu_provider(soc):
    with runtime.use_stand_in(make_stand_in(soc)):
        rep = run_conformance(backend="ascend", quick=True, soc=soc, ops=OPS)
    assert rep.ok, rep.format_table()
    for op in OPS:
        assert set(rep.ops[op].providers) == {"torch_npu"} and rep.ops[op].providers["torch_npu"] > 0, \
            rep.ops[op].providers


def test_logits_providers_decline_without_torch_npu_with_the_reason():
    q = quantized_queries(2, 4, 32, seed=1)
    kv = randn(8, 32, seed=2).to(torch.float8_e4m3fn)
    ends = torch.tensor([8, 8], dtype=torch.int32)
    call = MqaLogitsInputs(q, kv, torch.ones(8), randn(2, 4, seed=3), torch.zeros_like(ends), ends, False,
                           torch.empty(2, 8))
    reasons = _provider("fp8_mqa_logits").not_supported_reasons(call)
    assert any("torch_npu is not installed" in r for r in reasons), reasons


def test_a2a3_fp8_decoding_table_matches_torch_for_every_byte():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    got = npu_indexer._e4m3_to_float(codes, native_fp8=False)
    assert torch.equal(got.isnan(), codes.float().isnan())
    assert torch.equal(got.nan_to_num(), codes.float().nan_to_num())


def _paged_inputs(lengths, next_n, heads, block_kv, seed):
    cache, table = build_indexer_cache(lengths, block_kv, 128, seed=seed)
    q = quantized_queries(len(lengths), next_n, heads, 128, seed=seed + 2)
    weights = randn(len(lengths) * next_n, heads, seed=seed + 3)
    return q, cache, weights, paged_context_lens(lengths, next_n), table


def _reference_topk(q, cache, weights, lens, table, topk):
    width = int(lens.max())
    logits = paged_mqa_logits_reference(q, dequantize_indexer_cache(cache), weights, lens, table, max(width, 1))
    _, idx = topk_reference(logits, topk, end=lens.reshape(-1), sorted=True, indices_type=torch.int32,
                            idx_oob_fill_value=-1)
    return logits, idx


@pytest.mark.parametrize("lengths,next_n,heads,block_kv,topk", [
    ((300, 129, 5), 2, 64, 64, 128),
    ((70, 1, 130), 1, 8, 16, 64),
    ((200, 37), 3, 32, 32, 2048),  # more slots than keys: -1 past each row's keys
])
def test_fused_topk_matches_reference_logits_and_topk(lengths, next_n, heads, block_kv, topk):
    q, cache, weights, lens, table = _paged_inputs(lengths, next_n, heads, block_kv, seed=sum(lengths))
    npu = make_stand_in("950")
    got = npu_indexer.lightning_indexer_topk(npu, "950", q, cache, weights, lens, table, topk)
    logits, want = _reference_topk(q, cache, weights, lens, table, topk)
    assert npu.calls == ["npu_quant_lightning_indexer"] and got.dtype == torch.int32
    assert got.shape == (len(lengths) * next_n, topk)
    assert torch.equal(got == -1, want == -1)
    for row in range(got.shape[0]):
        assert set(got[row].tolist()) == set(want[row].tolist()), row
        picked = logits[row, got[row][got[row] >= 0].long()]
        assert bool((picked.diff() <= 1e-6 * picked.abs().max()).all())  # descending order


def test_fused_topk_passes_the_cache_as_views_without_copying():
    q, cache, weights, lens, table = _paged_inputs((100, 40), 1, 16, 32, seed=5)
    npu = make_stand_in("950")
    seen = {}
    original = npu.npu_quant_lightning_indexer

    def spy(query, key, w, scale_q, scale_k, *args, **kwargs):
        seen.update(key=key, scale_k=scale_k, w=w, scale_q=scale_q)
        return original(query, key, w, scale_q, scale_k, *args, **kwargs)
    npu.npu_quant_lightning_indexer = spy
    npu_indexer.lightning_indexer_topk(npu, "950", q, cache, weights, lens, table, 16)
    values, scales = indexer_cache_views(cache)
    storage = cache.untyped_storage().data_ptr()
    assert seen["key"].untyped_storage().data_ptr() == storage and seen["key"].dtype == torch.float8_e4m3fn
    assert seen["scale_k"].untyped_storage().data_ptr() == storage and torch.equal(seen["scale_k"][..., 0], scales)
    w = weights.view(2, 1, 16)
    assert torch.equal(seen["w"].float() * seen["scale_q"], w)  # sign(w) · |w| == w exactly


@pytest.mark.parametrize("chip,heads,block_kv,topk,needle", [
    ("910c", 64, 64, 128, "Ascend 950 only"),
    ("910b", 64, 64, 128, "Ascend 950 only"),
    ("950", 12, 64, 128, "query heads"),
    ("950", 64, 8, 128, "block_kv = 8 < 16"),
    ("950", 64, 64, 4096, "topk = 4096 > 2048"),
])
def test_fused_topk_refuses_with_the_documented_reason(chip, heads, block_kv, topk, needle):
    q, cache, weights, lens, table = _paged_inputs((40,), 1, heads, block_kv, seed=9)
    reasons = npu_indexer.lightning_indexer_topk_reasons(chip, q, cache, topk)
    assert any(needle in r for r in reasons), reasons
    with pytest.raises(ValueError, match="lightning_indexer_topk"):
        npu_indexer.lightning_indexer_topk(make_stand_in(chip), chip, q, cache, weights, lens, table, topk)


def test_fused_topk_refuses_context_lens_without_a_causal_form():
    q, cache, weights, lens, table = _paged_inputs((60, 50), 2, 8, 16, seed=11)
    lens[0, 0] = 10  # not context_lens[b, -1] - 1
    with pytest.raises(ValueError, match="context_lens"):
        npu_indexer.lightning_indexer_topk(make_stand_in("950"), "950", q, cache, weights, lens, table, 8)


def test_stand_in_refuses_fp32_weights_with_fp8_keys():
    q, cache, weights, lens, table = _paged_inputs((32,), 1, 8, 16, seed=13)
    values, scales = indexer_cache_views(cache)
    with pytest.raises(StandInError, match="dtypes"):
        make_stand_in("950").npu_quant_lightning_indexer(
            q, values.unsqueeze(2), weights.view(1, 1, 8), torch.ones(1, 1, 8), scales.unsqueeze(-1), 0, 0,
            actual_seq_lengths_query=torch.ones(1, dtype=torch.int32),
            actual_seq_lengths_key=torch.tensor([32], dtype=torch.int32), block_table=table, layout_key="PA_BSND")
