"""The ascend MLA decode providers against the torch_npu stand-in: FIA (A2/A3 dense), sparse flash
attention (A2/A3 sparse, 950 bf16) and the KV-quant sparse op on CANN's 656-byte rows (950).

The caches come from the conformance builder: unused slots are NaN and unused block_table entries
huge, so a provider that reads outside the valid slots shows it. Proves the documented calls, not the
NPU's numbers.
"""

import pytest
import torch

from ascend_stub import StandInError, make_stand_in
from portable_kernels.backends.ascend.vendor import mla as npu_mla
from portable_kernels.layouts import ASCEND_BF16_KV, ASCEND_FP8_KV, ascend_kv_to_flashmla
from portable_kernels.ops.attention.decode import HEAD_DIM_V, mla_decode_reference
from portable_kernels.testing.generators import poison, randn
from portable_kernels.testing.mla_cases import build_paged_cache, check_decode, random_indices, random_kv

SCALE = 576 ** -0.5


def _setup(lengths, s_q, h_q, block_size=64, fp8=False, seed=0):
    paged = build_paged_cache(random_kv(lengths, 1, 576, seed=seed), block_size, seed=seed, fp8=fp8)
    q = randn(len(lengths), s_q, h_q, 576, seed=seed + 2, dtype=torch.bfloat16)
    out = poison(len(lengths), s_q, h_q, HEAD_DIM_V, dtype=torch.bfloat16)
    lse = poison(len(lengths), h_q, s_q, dtype=torch.float32)
    return paged, q, out, lse


def _a2a3_cache(paged):
    """The cache as the A2/A3 providers receive it: an FP8 cache as its exact bf16 values (ASCEND_BF16_KV)."""
    return (ASCEND_BF16_KV.encode(paged.k_cache), ASCEND_BF16_KV) if paged.is_fp8 else (paged.k_cache, None)


def _reference(q, paged, causal, indices=None):
    return mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, SCALE, causal,
                                paged.is_fp8, indices, dtype=torch.float64)


@pytest.mark.parametrize("lengths,s_q,h_q,causal,fp8", [
    ((70, 0, 1, 130), 1, 16, False, False),
    ((90, 64, 2), 2, 8, True, False),        # 2 keys and 2 queries: stays on FIA
    ((3, 90), 4, 4, True, False),            # 3 keys < 4 queries: FIA too (the block rule is int8-output only)
    ((65, 0, 17), 1, 16, False, True),       # the FP8 cache, stored as its exact bf16 values (ASCEND_BF16_KV)
])
def test_dense_fia_on_a2_a3(lengths, s_q, h_q, causal, fp8):
    npu = make_stand_in("910b")
    paged, q, out, lse = _setup(lengths, s_q, h_q, fp8=fp8, seed=len(lengths))
    cache, fmt = _a2a3_cache(paged)
    npu_mla.dense_decode_fused_infer(npu, q, cache, paged.block_table, paged.cache_seqlens, SCALE, causal,
                                     out, lse, cache_format=fmt)
    check_decode(out, lse, *_reference(q, paged, causal))
    assert npu.calls == ["npu_fused_infer_attention_score"]


def test_fia_needs_the_causal_mask_for_sparse_mode_3():
    npu = make_stand_in("910c")
    paged, q, _, _ = _setup((40,), 2, 4)
    cache, table, _, _ = npu_mla.compact_dense(paged.k_cache, paged.block_table, paged.cache_seqlens, "bf16")
    nope, rope = cache[..., :512].contiguous().view(-1, 64, 512), cache[..., 512:].contiguous().view(-1, 64, 64)
    q2 = q.reshape(2, 4, 576)
    with pytest.raises(StandInError, match="atten_mask"):
        npu.npu_fused_infer_attention_score(
            q2[..., :512].contiguous(), nope, nope, query_rope=q2[..., 512:].contiguous(), key_rope=rope,
            actual_seq_lengths=[2], actual_seq_lengths_kv=[40], block_table=table, num_heads=4,
            input_layout="TND", num_key_value_heads=1, sparse_mode=3, block_size=64)


def test_fia_is_not_documented_on_950():
    npu = make_stand_in("950")
    paged, q, out, lse = _setup((10,), 1, 4)
    with pytest.raises(StandInError, match="A2/A3 only"):
        npu_mla.dense_decode_fused_infer(npu, q, paged.k_cache, paged.block_table, paged.cache_seqlens, SCALE,
                                         False, out, lse)


@pytest.mark.parametrize("soc", ["910b", "950"])
def test_sparse_bf16_reads_only_the_indexed_slots(soc):
    # the FP8 cache's exact bf16 values (A2/A3's KV-cache Format); 950 takes bf16 rows too
    npu = make_stand_in(soc)
    paged, q, out, lse = _setup((100, 0, 7), 2, 16, block_size=16, fp8=True, seed=5)
    indices = random_indices(paged, 2, 32, seed=6)[0]
    cache, fmt = _a2a3_cache(paged)
    npu_mla.sparse_decode(npu, q, cache, indices, SCALE, out, lse, fp8_op=False, cache_format=fmt)
    check_decode(out, lse, *_reference(q, paged, False, indices))
    assert npu.calls == ["npu_sparse_flash_attention"]


def test_sparse_fp8_on_950_reads_cann_rows():
    npu = make_stand_in("950")
    paged, q, out, lse = _setup((100, 0, 7), 2, 16, block_size=16, fp8=True, seed=7)
    indices = random_indices(paged, 2, 32, seed=8)[0]
    npu_mla.sparse_decode(npu, q, ASCEND_FP8_KV.encode(paged.k_cache), indices, SCALE, out, lse, fp8_op=True,
                          cache_format=ASCEND_FP8_KV)
    check_decode(out, lse, *_reference(q, paged, False, indices))
    assert npu.calls == ["npu_kv_quant_sparse_flash_attention"]


def test_fp8_keys_are_refused_by_the_kv_quant_op_on_a2_a3():
    npu = make_stand_in("910c")
    paged, q, out, lse = _setup((20,), 1, 16, block_size=16, fp8=True)
    indices = random_indices(paged, 1, 8, seed=1)[0]
    with pytest.raises(StandInError, match="int8"):
        npu_mla.sparse_decode(npu, q, ASCEND_FP8_KV.encode(paged.k_cache), indices, SCALE, out, lse, fp8_op=True,
                              cache_format=ASCEND_FP8_KV)


def test_the_kv_quant_op_reads_cann_order_not_flashmla_order():
    npu = make_stand_in("950")
    paged, q, _, _ = _setup((30,), 1, 16, block_size=16, fp8=True, seed=9)
    indices = random_indices(paged, 1, 8, seed=10, invalid_fraction=0.0)[0]
    cache, table, lengths, positions, _, _ = npu_mla.compact_sparse(ASCEND_FP8_KV.encode(paged.k_cache), indices,
                                                                    "ascend-fp8", ASCEND_FP8_KV)
    right = npu_mla._sfa_fp8(npu, q, cache, table, lengths, positions, 0, SCALE)
    wrong = npu_mla._sfa_fp8(npu, q, ascend_kv_to_flashmla(cache), table, lengths, positions, 0, SCALE)
    ref_out, _ = _reference(q, paged, False, indices)
    assert torch.allclose(right.double(), ref_out, atol=1e-2, rtol=2e-2)
    assert not torch.allclose(wrong.double(), ref_out, atol=1e-2, rtol=2e-2)


@pytest.mark.parametrize("fp8,causal,s_q", [(True, False, 1), (True, True, 3), (False, True, 2)])
def test_dense_on_950_as_sparse_over_every_position(fp8, causal, s_q):
    npu = make_stand_in("950")
    paged, q, out, lse = _setup((70, 1, 130), s_q, 16, fp8=fp8, seed=11)
    cache, fmt = (ASCEND_FP8_KV.encode(paged.k_cache), ASCEND_FP8_KV) if fp8 else (paged.k_cache, None)
    npu_mla.dense_decode_as_sparse(npu, q, cache, paged.block_table, paged.cache_seqlens, SCALE, causal,
                                   out, lse, fp8_op=fp8, cache_format=fmt)
    check_decode(out, lse, *_reference(q, paged, causal))


def test_valid_first_keeps_order_and_moves_invalid_to_the_end():
    idx = torch.tensor([[[5, -1, 3, -1, 9]]], dtype=torch.int32)
    assert npu_mla.valid_first(idx).flatten().tolist() == [5, 3, 9, -1, -1]


def _pair(cache_and_format, indices):
    cache, fmt = cache_and_format
    return cache, indices, "bf16", fmt


@pytest.mark.parametrize("sparse", [False, True])
def test_the_bf16_ops_refuse_flashmla_rows_instead_of_dequantizing_them_per_call(sparse):
    # the A2/A3 providers convert no cache: 656-byte rows reach them only by a bug, and raise
    npu = make_stand_in("910b")
    paged, q, out, lse = _setup((20,), 1, 16, block_size=16, fp8=True)
    with pytest.raises(ValueError, match="bf16 rows"):
        if sparse:
            npu_mla.sparse_decode(npu, q, paged.k_cache, random_indices(paged, 1, 8, seed=1)[0], SCALE, out, lse,
                                  fp8_op=False)
        else:
            npu_mla.dense_decode_fused_infer(npu, q, paged.k_cache, paged.block_table, paged.cache_seqlens, SCALE,
                                             False, out, lse)
    assert npu.calls == []


def test_sparse_op_refuses_invalid_indices_before_valid_ones():
    npu = make_stand_in("910b")
    paged, q, _, _ = _setup((40,), 1, 16, block_size=16, fp8=True)
    indices = random_indices(paged, 1, 4, seed=3, invalid_fraction=0.0)[0]
    cache, table, lengths, _, _, _ = npu_mla.compact_sparse(*_pair(_a2a3_cache(paged), indices))
    bad = torch.tensor([[[[-1, 3, 1, 0]]]], dtype=torch.int32)
    with pytest.raises(StandInError, match="valid indices must come first"):
        npu_mla._sfa_bf16(npu, q, cache, table, lengths, bad, 0, SCALE)


def test_the_kv_quant_path_refuses_a_flashmla_order_cache():
    npu = make_stand_in("950")
    paged, q, out, lse = _setup((20,), 1, 16, block_size=16, fp8=True)
    indices = random_indices(paged, 1, 8, seed=1)[0]
    with pytest.raises(ValueError, match="CANN|ascend-fp8-kv"):
        npu_mla.sparse_decode(npu, q, paged.k_cache, indices, SCALE, out, lse, fp8_op=True)
