"""The cpu backend's native lightning-indexer logits (backends/cpu/providers/indexer.py, kernels/indexer.cpp):
the conformance suites served by "native" under every ISA build this machine runs (PK_NATIVE_ISA),
identical logits from the FMA builds, bf16 weights and logits, compressed rows, the entries it must
leave alone, and the calls it declines or refuses."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.backends.cpu.providers import indexer as ni
from portable_kernels.core.dispatch import run, trace_providers
from portable_kernels.core.errors import ContractError
from portable_kernels.core.native.build import ISA_ENV, detected_isa
from portable_kernels.core.numerics import calc_diff
from portable_kernels.core.registry import registry
from portable_kernels.layouts import quantize_indexer_keys
from portable_kernels.ops.attention.indexer import (MQA_LOGITS, MqaLogitsInputs, PagedMqaLogitsInputs,
                                                    allocate_logits, mqa_logits_reference)
from portable_kernels.testing import run_conformance
from portable_kernels.testing.generators import randn
from portable_kernels.testing.indexer_cases import (build_indexer_cache, cp_ranges, paged_context_lens,
                                                    poisoned_logits, quantized_queries)

pytestmark = pytest.mark.skipif(ni.LIB.get() is None, reason="native indexer needs the built library")

OPS = ["fp8_mqa_logits", "fp8_paged_mqa_logits"]
X86 = ("avx512", "avx2", "generic")
LANES = {"avx512": 16, "avx2": 8, "neon": 4, "generic": 4}


def _use_isa(monkeypatch, level: str) -> None:
    """Build and load the library for `level` for this test (the detected build comes back after)."""
    detected = detected_isa()[0]
    if level != detected and not (detected in X86 and level in X86 and X86.index(level) > X86.index(detected)):
        pytest.skip(f"this machine ({detected}) cannot execute a {level} build")
    monkeypatch.setenv(ISA_ENV, level)
    monkeypatch.setattr(ni.LIB, "_lib", None)
    monkeypatch.setattr(ni.LIB, "_tried_isa", None)
    assert ni.LIB.get() is not None, ni.LIB.reason()


@pytest.fixture(params=["detected", "avx2", "generic"])
def isa(request, monkeypatch):
    level = detected_isa()[0] if request.param == "detected" else request.param
    _use_isa(monkeypatch, level)
    return level


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_conformance_is_served_by_native_on_every_isa_build(isa, quick):
    assert ni.lanes() == LANES[isa]  # the build the test asked for is the one that runs
    report = run_conformance(backend="cpu", ops=OPS, quick=quick)
    for op in OPS:
        outcome = report.ops[op]
        assert outcome.passed == outcome.cases and not outcome.failures, outcome
        assert outcome.providers.get("native", 0) > 0 and "reference" not in outcome.providers, outcome.providers


def _prefill(m=19, n=150, h=64, d=128, seed=5, weights_dtype=torch.float32):
    q = quantized_queries(m, h, d, seed=seed)
    kv = quantize_indexer_keys(randn(n, d, seed=seed + 1, dtype=torch.bfloat16))
    w = randn(m, h, seed=seed + 2).to(weights_dtype)
    ks, ke = cp_ranges(m, n, False)
    return q, kv, w, ks, ke


def _paged(lengths=(200, 65, 3), next_n=2, h=32, d=128, block_kv=64, seed=8):
    cache, table = build_indexer_cache(lengths, block_kv, d, seed=seed)
    q = quantized_queries(len(lengths), next_n, h, d, seed=seed + 1)
    w = randn(len(lengths) * next_n, h, seed=seed + 2)
    lens = paged_context_lens(lengths, next_n)
    return q, cache, w, lens, table, pk.get_paged_mqa_logits_metadata(lens, block_kv, 4), max(lengths) + 3


def _both_ops():
    return pk.fp8_mqa_logits(*_prefill()), pk.fp8_paged_mqa_logits(*_paged(), clean_logits=True)


def test_avx512_and_avx2_builds_give_bit_identical_logits(monkeypatch):
    if detected_isa()[0] != "avx512":
        pytest.skip("needs a machine that executes both the AVX-512 and the AVX2 build")
    _use_isa(monkeypatch, "avx512")
    wide = _both_ops()
    _use_isa(monkeypatch, "avx2")
    narrow = _both_ops()
    for a, b in zip(wide, narrow):
        assert torch.equal(a, b)


def test_generic_build_agrees_with_the_fma_builds_within_the_contract_tolerance(monkeypatch):
    fma = _both_ops()
    _use_isa(monkeypatch, "generic")
    for a, b in zip(fma, _both_ops()):
        valid = a != float("-inf")
        assert torch.equal(valid, b != float("-inf"))
        assert calc_diff(a[valid], b[valid]) < 1e-9


def test_bf16_weights_give_the_fp32_logits_rounded_like_torch():
    q, kv, w, ks, ke = _prefill(weights_dtype=torch.bfloat16)
    with trace_providers() as ran:
        got = pk.fp8_mqa_logits(q, kv, w, ks, ke, logits_dtype=torch.bfloat16)
        fp32 = pk.fp8_mqa_logits(q, kv, w.float(), ks, ke)  # the same fp32 sums, unrounded
    assert {name for _, _, name in ran} == {"native"}
    assert got.dtype == torch.bfloat16 and torch.equal(got, fp32.to(torch.bfloat16))
    want = mqa_logits_reference(q, kv[0].float() * kv[1][:, None], w.float(), ks, ke)
    valid = want != float("-inf")
    assert calc_diff(got.float()[valid], want[valid]) < 3e-5


def test_compressed_rows_hold_their_keys_from_column_zero():
    q, kv, w, _, _ = _prefill(m=5, n=140)
    ks = torch.tensor([0, 17, 64, 64, 100], dtype=torch.int32)
    ke = torch.tensor([70, 17, 130, 65, 140], dtype=torch.int32)
    full = pk.fp8_mqa_logits(q, kv, w, ks, ke)
    with trace_providers() as ran:
        packed = pk.fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=False, max_seqlen_k=70)
    assert ran == [("fp8_mqa_logits", "cpu", "native")]
    for i in range(5):
        s, e = int(ks[i]), int(ke[i])
        assert torch.equal(packed[i, : e - s], full[i, s:e])


def test_entries_outside_each_rows_keys_are_left_as_they_were():
    q, kv, w, ks, ke = _prefill(m=6, n=90)
    with poisoned_logits():
        got = pk.fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=False)
        paged = pk.fp8_paged_mqa_logits(*_paged(), clean_logits=False)
    cols = torch.arange(90)[None, :]
    valid = (cols >= ks[:, None]) & (cols < ke[:, None])
    assert bool(torch.isnan(got[~valid]).all()) and not bool(torch.isnan(got[valid]).any())
    lens = _paged()[3].reshape(-1, 1)
    inside = torch.arange(paged.shape[1])[None, :] < lens
    assert bool(torch.isnan(paged[~inside]).all()) and not bool(torch.isnan(paged[inside]).any())


def _native(op: str):
    return next(p for p in registry().providers(op, "cpu") if p.name == "native")


def test_logits_without_unit_column_stride_are_declined_and_run_on_reference():
    q, kv, w, ks, ke = _prefill(m=8, n=40, h=8, d=32)
    logits = torch.full((40, 8), float("-inf")).t()  # [8, 40] with column stride 8
    call = MqaLogitsInputs(q, kv[0], kv[1], w, ks, ke, False, logits)
    reasons = _native(MQA_LOGITS.name).not_supported_reasons(call)
    assert any("'logits'" in r and "unit column stride" in r for r in reasons), reasons
    with trace_providers() as ran:
        run(MQA_LOGITS, call)
    assert ran == [("fp8_mqa_logits", "cpu", "reference")]
    want = mqa_logits_reference(q, kv[0].float() * kv[1][:, None], w, ks, ke)
    valid = want != float("-inf")
    assert calc_diff(logits[valid], want[valid]) < 5e-6
    with pytest.raises(ContractError, match="unit column stride"):
        ni.mqa_logits_native(call)  # called directly it refuses, before the C++ runs


def test_a_block_reference_outside_the_cache_is_refused_by_the_kernel_itself():
    q, cache, w, lens, table, meta, width = _paged()
    table = table.clone()
    table[1, 0] = cache.shape[0]  # the op's value checks would refuse it first; the kernel checks again
    logits = allocate_logits(q.shape[0] * q.shape[1], width, width, torch.float32, torch.device("cpu"))
    call = PagedMqaLogitsInputs(q, cache, w, lens, table, meta, logits)
    assert _native("fp8_paged_mqa_logits").not_supported_reasons(call) == []
    with pytest.raises(ContractError, match="block outside the table or the cache"):
        ni.paged_mqa_logits_native(call)


def test_the_packed_call_matches_the_library():
    assert ni._CALL.size == ni.LIB.get().pk_indexer_call_size()
