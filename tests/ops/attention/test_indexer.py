"""Lightning-indexer logits: the reference against a loop over the formula, the checker's teeth, the
layouts of the outputs, the paged schedule, a bad-input catalogue, and the conformance runs."""

import pytest
import torch

import portable_kernels as pk
from portable_kernels import ContractError
from portable_kernels.layouts import (dequantize_indexer_cache, indexer_cache_views, quantize_fp4_rows,
                                      quantize_indexer_keys)
from portable_kernels.testing import CaseFailure, run_conformance
from portable_kernels.testing.generators import randn
from portable_kernels.testing.indexer_cases import (build_indexer_cache, check_logits, cp_ranges, paged_context_lens,
                                                    quantized_queries)


def _loop_logits(q, k, w, ks, ke):
    """sum_h relu(q[i, h] . k[j]) * w[i, h], element by element (the formula as DeepGEMM states it)."""
    m, n = q.shape[0], k.shape[0]
    out = torch.full((m, n), float("-inf"))
    for i in range(m):
        for j in range(int(ks[i]), int(ke[i])):
            out[i, j] = sum(max(float(q[i, h].float() @ k[j].float()), 0.0) * float(w[i, h]) for h in range(q.shape[1]))
    return out


def _prefill(m=6, n=20, h=4, d=16, seed=3):
    q = quantized_queries(m, h, d, seed=seed)
    kv = quantize_indexer_keys(randn(n, d, seed=seed + 1))
    w = randn(m, h, seed=seed + 2)
    ks, ke = cp_ranges(m, n, False)
    return q, kv, w, ks, ke


def test_prefill_logits_are_the_formula_on_dequantized_keys():
    q, kv, w, ks, ke = _prefill()
    got = pk.fp8_mqa_logits(q, kv, w, ks, ke)
    want = _loop_logits(q, kv[0].float() * kv[1][:, None], w, ks, ke)
    valid = want != float("-inf")
    assert torch.equal(got == float("-inf"), ~valid)
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-5, atol=1e-5)


def test_paged_logits_read_each_sequences_blocks_through_the_table():
    lengths = (37, 5)
    cache, table = build_indexer_cache(lengths, 16, 16, seed=9)
    q = quantized_queries(2, 2, 4, 16, seed=10)
    w = randn(4, 4, seed=11)
    lens = paged_context_lens(lengths, 2)
    meta = pk.get_paged_mqa_logits_metadata(lens, 16, 3)
    got = pk.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, 40, clean_logits=True)
    keys = dequantize_indexer_cache(cache)
    for b, n in enumerate(lengths):
        seq = torch.cat([keys[int(table[b, j])] for j in range(-(-n // 16))])[:n]
        for t in range(2):
            row = b * 2 + t
            end = int(lens[b, t])
            want = _loop_logits(q[b, t:t + 1], seq, w[row:row + 1], torch.zeros(1), torch.tensor([end]))
            torch.testing.assert_close(got[row, :end], want[0, :end], rtol=1e-5, atol=1e-5)
            assert bool((got[row, end:] == float("-inf")).all())


def test_the_cache_views_are_deep_gemms_bytes():
    cache, _ = build_indexer_cache((20,), 16, 32, seed=1)
    values, scales = indexer_cache_views(cache)
    raw = cache.view(cache.shape[0], -1)
    assert torch.equal(values[1].reshape(-1).view(torch.uint8), raw[1, :16 * 32])
    assert torch.equal(scales[1].view(torch.uint8), raw[1, 16 * 32:])
    values[0, 3, 0] = torch.tensor(2.0).to(torch.float8_e4m3fn)  # views write the cache
    assert int(raw[0, 3 * 32]) == int(torch.tensor(2.0).to(torch.float8_e4m3fn).view(torch.uint8))


def test_logits_rows_are_1024_byte_aligned_as_deep_gemm_allocates():
    q, kv, w, ks, ke = _prefill(n=20)
    assert pk.fp8_mqa_logits(q, kv, w, ks, ke).stride() == (512, 1)  # align(20 + 256, 1024 B of fp32)
    bf16 = pk.fp8_mqa_logits(q, kv, w, ks, ke, logits_dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and bf16.stride() == (512, 1)
    compressed = pk.fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=False, max_seqlen_k=int((ke - ks).max()))
    assert compressed.shape == (6, 19) and compressed.stride() == (256, 1)  # the longest row: 19 keys


def test_compressed_logits_start_at_each_rows_first_key():
    q, kv, w, _, _ = _prefill(m=4, n=30)
    ks = torch.tensor([0, 5, 9, 20], dtype=torch.int32)
    ke = torch.tensor([3, 12, 9, 30], dtype=torch.int32)
    full = pk.fp8_mqa_logits(q, kv, w, ks, ke)
    packed = pk.fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=False, max_seqlen_k=10)
    for i in range(4):
        assert torch.equal(packed[i, : int(ke[i] - ks[i])], full[i, int(ks[i]): int(ke[i])])


def test_schedule_splits_the_key_blocks_evenly_in_order():
    lens = torch.tensor([[100], [0], [64], [1]], dtype=torch.int32)  # 2, 0, 1, 1 blocks of 64
    meta = pk.get_paged_mqa_logits_metadata(lens, 64, 2)
    assert meta.dtype == torch.int32 and meta.tolist() == [[0, 0], [2, 0], [4, 0]]
    meta = pk.get_paged_mqa_logits_metadata(lens, 64, 4)
    assert meta.tolist() == [[0, 0], [0, 1], [2, 0], [3, 0], [4, 0]]


@pytest.mark.parametrize("defect", ["no relu", "unwritten entry", "extra -inf", "wrong stride"])
def test_checker_catches_a_broken_result(defect):
    q, kv, w, ks, ke = _prefill()
    want = pk.ops.attention.indexer.mqa_logits_reference(q, kv[0].float() * kv[1][:, None], w, ks, ke)
    valid = want != float("-inf")
    got = pk.fp8_mqa_logits(q, kv, w, ks, ke)
    if defect == "no relu":
        k = kv[0].float() * kv[1][:, None]
        bad = torch.einsum("mhd,nd,mh->mn", q.float(), k, w).masked_fill(~valid, float("-inf"))
        got = torch.empty(6, 256)[:, :20].copy_(bad)
    elif defect == "unwritten entry":
        got[2, 5] = float("nan")
    elif defect == "extra -inf":
        got[3, 0] = float("-inf")
    else:
        got = got.contiguous()
    with pytest.raises(CaseFailure):
        check_logits(got, want, valid, True, 5e-6)


def _fp4_pair(x):
    packed, words = quantize_fp4_rows(x)
    return packed.view(torch.int8), words


def _bad_prefill_calls():
    q, kv, w, ks, ke = _prefill()
    fp4_q = _fp4_pair(randn(6, 4, 32, seed=8))
    fp4_kv = _fp4_pair(randn(20, 32, seed=9))
    late = ke.clone()
    late[1] = 21
    return {
        "q": lambda: pk.fp8_mqa_logits(q.float(), kv, w, ks, ke),
        "q fp4": lambda: pk.fp8_mqa_logits((q, torch.ones(6, 4)), kv, w, ks, ke),
        "q fp4 scales": lambda: pk.fp8_mqa_logits((fp4_q[0], fp4_q[1][:, :2]), fp4_kv, w, ks, ke),
        "q fp4 head dim": lambda: pk.fp8_mqa_logits((fp4_q[0][..., :8], fp4_q[1]), fp4_kv, w, ks, ke),
        "kv fp8 with fp4 q": lambda: pk.fp8_mqa_logits(fp4_q, kv, w, ks, ke),
        "kv fp4 with fp8 q": lambda: pk.fp8_mqa_logits(q, fp4_kv, w, ks, ke),
        "kv": lambda: pk.fp8_mqa_logits(q, (kv[0][:, :8], kv[1]), w, ks, ke),
        "kv scales": lambda: pk.fp8_mqa_logits(q, (kv[0], kv[1][:5]), w, ks, ke),
        "weights": lambda: pk.fp8_mqa_logits(q, kv, w.t(), ks, ke),
        "weights bf16": lambda: pk.fp8_mqa_logits(q, kv, w.bfloat16(), ks, ke),
        "cu_seq_len_k_start": lambda: pk.fp8_mqa_logits(q, kv, w, ks.long(), ke),
        "cu_seq_len_k_end": lambda: pk.fp8_mqa_logits(q, kv, w, ks, late),
        "clean_logits": lambda: pk.fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=True, max_seqlen_k=20),
        "max_seqlen_k": lambda: pk.fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=False, max_seqlen_k=2),
        "logits_dtype": lambda: pk.fp8_mqa_logits(q, kv, w, ks, ke, logits_dtype=torch.float16),
    }


@pytest.mark.parametrize("name", list(_bad_prefill_calls()))
def test_fp8_mqa_logits_bad_input(name):
    with pytest.raises(ContractError, match=f"'{name.split()[0]}'"):
        _bad_prefill_calls()[name]()


def _bad_paged_calls():
    cache, table = build_indexer_cache((40, 9), 16, 32, seed=4)
    q = quantized_queries(2, 1, 8, 32, seed=5)
    w = randn(2, 8, seed=6)
    lens = paged_context_lens((40, 9), 1)
    meta = pk.get_paged_mqa_logits_metadata(lens, 16, 4)
    far = table.clone()
    far[0, 1] = -1
    narrow = cache[:, :, :, :20]
    return {
        "q": lambda: pk.fp8_paged_mqa_logits(q[0], cache, w, lens, table, meta, 48),
        "kv_cache": lambda: pk.fp8_paged_mqa_logits(q, narrow, w, lens, table, meta, 48),
        "kv_cache dtype": lambda: pk.fp8_paged_mqa_logits(q, cache.view(torch.int8), w, lens, table, meta, 48),
        "context_lens": lambda: pk.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, 30),
        "block_table": lambda: pk.fp8_paged_mqa_logits(q, cache, w, lens, far, meta, 48),
        "block_table narrow": lambda: pk.fp8_paged_mqa_logits(q, cache, w, lens, table[:, :2], meta, 48),
        "schedule_meta": lambda: pk.fp8_paged_mqa_logits(q, cache, w, lens, table, meta[:, :1], 48),
        "indices": lambda: pk.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, 48,
                                                   indices=torch.tensor([0, 2], dtype=torch.int32)),
        "weights": lambda: pk.fp8_paged_mqa_logits(q, cache, w[:1], lens, table, meta, 48),
        # FP4 q (packed: 16 bytes per row of 32) reads the FP4 cache of 16 + 4 bytes per token
        "kv_cache fp8 with fp4 q": lambda: pk.fp8_paged_mqa_logits(_fp4_pair(q.float()), cache, w, lens, table, meta,
                                                                   48),
    }


@pytest.mark.parametrize("name", list(_bad_paged_calls()))
def test_fp8_paged_mqa_logits_bad_input(name):
    with pytest.raises(ContractError, match=f"'{name.split()[0]}'"):
        _bad_paged_calls()[name]()


@pytest.mark.parametrize("bad", ["context_lens", "block_kv", "num_sms"])
def test_get_paged_mqa_logits_metadata_bad_input(bad):
    lens = torch.tensor([[3]], dtype=torch.int32)
    args = {"context_lens": lens, "block_kv": 64, "num_sms": 4}
    args[bad] = {"context_lens": lens.view(-1), "block_kv": 0, "num_sms": -1}[bad]
    with pytest.raises(ContractError, match=f"'{bad}'"):
        pk.get_paged_mqa_logits_metadata(**args)


@pytest.mark.parametrize("backend,options", [("cpu", {}), ("nvidia", {"arch": "sm90"}), ("nvidia", {"arch": "sm100"}),
                                             ("ascend", {})])
def test_conformance_passes(backend, options):
    report = run_conformance(backend=backend, ops=["fp8_mqa_logits", "fp8_paged_mqa_logits"], quick=True, **options)
    for op in ("fp8_mqa_logits", "fp8_paged_mqa_logits"):
        outcome = report.ops[op]
        assert outcome.passed == outcome.cases and not outcome.failures, outcome
