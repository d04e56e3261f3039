"""FlashMLA call sites ported with one import (`import portable_kernels.flash_mla as flash_mla`), in
the style of FlashMLA's own tests (written here): no-argument metadata, caches poisoned with NaN in
unused slots and quantized by FlashMLA's rule (passed as float8_e4m3fn), sparse decode with
attn_sink / topk_length / an extra cache, sparse prefill and varlen prefill, checked against
references written from FlashMLA's documented math with its published tolerances."""

from __future__ import annotations

import math

import pytest
import torch

import portable_kernels as pk
import portable_kernels.flash_mla as flash_mla

OUT_ABS, OUT_REL, LSE_ABS, LSE_REL = 8e-4, 2.01 / 128, 1e-6, 8.01 / 65536


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _allclose(got, want, abs_tol, rel_tol):
    got, want = got.double(), want.double()
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    assert ((got - want).abs()[finite] <= abs_tol + rel_tol * want.abs()[finite]).all()


# -- FlashMLA's quantizer, written from its documented rule ------------------------------------------

def fm_quantize(k):  # [nb, bs, 1, 576] bf16 -> uint8 [nb, bs, 1, 656]
    nb, bs = k.shape[:2]
    k = k.squeeze(2)
    out = torch.empty(nb, bs, 656, dtype=torch.uint8)
    out[..., 528:] = k[..., 512:].contiguous().view(torch.uint8)
    for t in range(4):
        tile = k[..., 128 * t:128 * (t + 1)]
        sf = torch.pow(2, torch.clamp_min(tile.abs().amax(-1).float() / 448.0, 1e-4).log2().ceil()).float()
        out[..., 512 + 4 * t:516 + 4 * t] = sf.unsqueeze(-1).contiguous().view(torch.uint8)
        out[..., 128 * t:128 * (t + 1)] = (tile.float() / sf.unsqueeze(-1)).to(torch.float8_e4m3fn).view(torch.uint8)
    return out.view(nb, bs, 1, 656)


def test_quantize_k_cache_writes_flashmla_bytes_for_a_magnitude_sweep_zeros_and_nan():
    k = torch.randn(4, 64, 1, 576).to(torch.bfloat16)
    k[0] *= torch.logspace(-30, 10, 64, base=2).view(64, 1, 1).to(torch.bfloat16)   # tiny to large tokens
    k[1, :5] = 0                                                                      # all-zero tokens
    k[2, 10:] = float("nan")                                                          # poisoned unused slots
    got = flash_mla.quantize_k_cache(k)
    assert got.dtype == torch.float8_e4m3fn and got.shape == (4, 64, 1, 656)
    assert torch.equal(got.view(torch.uint8), fm_quantize(k))
    assert got.view(torch.uint8)[1, 0, 0, 512:516].tolist() == [0x00, 0x00, 0x00, 0x39]      # 2^-13
    assert pk.layouts.pack_fp8_kv_cache(k[1, 0, 0, :512], k[1, 0, 0, 512:])[512:516].tolist() == [0, 0, 0x80, 0x34]
    back = flash_mla.dequantize_k_cache(got)
    assert pk.calc_diff(back[3].float(), k[3].float()) < 1e-3


MODEL1 = flash_mla.FP8KVCacheLayout.MODEL1_FP8Sparse


def fm_quantize_model1(k):  # [nb, bs, 1, 512] bf16 -> uint8 pages [nb, bs, 1, 584], each page padded to 576·n
    nb, bs = k.shape[:2]
    k = k.squeeze(2)
    padded = -(-bs * 584 // 576) * 576
    out = torch.zeros(nb, padded, dtype=torch.uint8)
    values = out[:, :bs * 576].view(nb, bs, 576)
    scales = out[:, bs * 576:bs * 584].view(nb, bs, 8)
    values[..., 448:] = k[..., 448:].contiguous().view(torch.uint8)
    for t in range(7):
        tile = k[..., 64 * t:64 * (t + 1)]
        sf = torch.pow(2, torch.clamp_min(tile.abs().max(-1).values.float() / 448.0, 1e-4).log2().ceil()).float()
        scales[..., t] = sf.to(torch.float8_e8m0fnu).view(torch.uint8)
        values[..., 64 * t:64 * (t + 1)] = (tile.float() / sf.unsqueeze(-1)).to(torch.float8_e4m3fn).view(torch.uint8)
    return out[:, :bs * 584].view(nb, bs, 1, 584)


@pytest.mark.parametrize("block_size", [64, 2, 69])
def test_quantize_k_cache_writes_flashmla_model1_pages_for_a_magnitude_sweep_zeros_and_nan(block_size):
    k = torch.randn(4, block_size, 1, 512).to(torch.bfloat16)
    k[0] *= torch.logspace(-30, 10, block_size, base=2).view(block_size, 1, 1).to(torch.bfloat16)
    k[1, :1] = 0                                                                      # an all-zero token
    k[2, 1:] = float("nan")                                                           # poisoned unused slots
    got = flash_mla.quantize_k_cache(k, MODEL1)
    assert got.dtype == torch.float8_e4m3fn and got.shape == (4, block_size, 1, 584)
    assert torch.equal(got.view(torch.uint8), fm_quantize_model1(k))
    assert got.view(torch.uint8)[1].view(-1)[block_size * 576:block_size * 576 + 8].tolist() == [0x72] * 7 + [0]
    back = flash_mla.dequantize_k_cache(got, MODEL1)
    assert back.shape == (4, block_size, 1, 512) and back.dtype == torch.bfloat16
    assert torch.equal(back[3, ..., 448:], k[3, ..., 448:])
    assert pk.calc_diff(back[3].float(), k[3].float()) < 1e-3
    assert torch.equal(flash_mla.dequantize_k_cache(fm_quantize_model1(k), MODEL1).nan_to_num(7.0),
                       back.nan_to_num(7.0))                                         # FlashMLA's padded pages


def test_quantize_k_cache_refuses_a_cache_of_the_other_layouts_head_dim():
    with pytest.raises(pk.ContractError, match="input_k_cache"):
        flash_mla.quantize_k_cache(torch.zeros(1, 64, 1, 576, dtype=torch.bfloat16), MODEL1)
    with pytest.raises(pk.ContractError, match="quant_k_cache"):
        flash_mla.dequantize_k_cache(torch.zeros(1, 64, 1, 656, dtype=torch.uint8), MODEL1)
    with pytest.raises(pk.ContractError, match="kvcache_layout"):
        flash_mla.quantize_k_cache(torch.zeros(1, 64, 1, 512, dtype=torch.bfloat16), "MODEL1")


# -- decode ------------------------------------------------------------------------------------------

def _paged(lengths, block_size, d=576, dtype=torch.bfloat16):
    """A paged cache whose unused slots hold NaN and unused table entries a huge index (FlashMLA's trick)."""
    b = len(lengths)
    max_blocks = max(-(-n // block_size) for n in lengths) + 1
    num_blocks = b * max_blocks
    perm = torch.randperm(num_blocks).view(b, max_blocks).to(torch.int32)
    table = perm.clone()
    blocked = torch.randn(num_blocks, block_size, 1, d).to(dtype) / 4
    for i, n in enumerate(lengths):
        used = -(-n // block_size)
        table[i, used:] = 2 ** 31 - 1
        for j in range(max_blocks):
            rows = slice(max(0, n - j * block_size), None)
            blocked[int(perm[i, j]), rows] = float("nan")
    return blocked, table, torch.tensor(lengths, dtype=torch.int32)


def _dense_ref(q, blocked, table, lengths, causal, scale):
    b, s_q, h_q, d = q.shape
    outs, lses = [], []
    for i in range(b):
        n = int(lengths[i])
        kv = torch.cat([blocked[int(table[i, j])] for j in range(-(-n // blocked.shape[1]))])[:n, 0].double() \
            if n else torch.zeros(0, d, dtype=torch.float64)
        logits = torch.einsum("qhd,kd->hqk", q[i].double(), kv) * scale
        if causal:
            mask = torch.ones(s_q, n, dtype=torch.bool).tril(n - s_q)
            logits = logits.masked_fill(~mask, -math.inf)
        lse = torch.logsumexp(logits, -1)
        w = torch.exp(logits - lse.masked_fill(torch.isneginf(lse), math.inf).unsqueeze(-1))
        outs.append(torch.einsum("hqk,kv->qhv", w, kv[:, :512]))
        lses.append(lse.masked_fill(torch.isneginf(lse), math.inf))
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("causal,dtype", [(False, torch.bfloat16), (True, torch.bfloat16), (False, torch.float16)])
def test_dense_decode_with_no_argument_metadata(causal, dtype):
    blocked, table, lengths = _paged([70, 0, 130], 64, dtype=dtype)
    q = torch.randn(3, 2, 16, 576).to(dtype)
    sched, splits = flash_mla.get_mla_metadata()
    assert splits is None and not sched.have_initialized
    out, lse = flash_mla.flash_mla_with_kvcache(q, blocked, table, lengths, 512, sched, None, causal=causal)
    assert sched.have_initialized and out.dtype == dtype
    ref_out, ref_lse = _dense_ref(q, blocked, table, lengths, causal, 576 ** -0.5)
    _allclose(out, ref_out, OUT_ABS, OUT_REL)
    _allclose(lse, ref_lse, LSE_ABS, LSE_REL)
    out2, _ = flash_mla.flash_mla_with_kvcache(q, blocked, table, lengths, 512, sched, None, causal=causal)
    assert torch.equal(out, out2)  # the metadata is reused
    with pytest.raises(pk.ContractError, match="tile_scheduler_metadata"):
        flash_mla.flash_mla_with_kvcache(q[:2], blocked, table[:2], lengths[:2], 512, sched, None, causal=causal)


def test_old_style_metadata_arguments_are_accepted_and_ignored():
    sched, splits = flash_mla.get_mla_metadata(torch.ones(2, dtype=torch.int32), 16, 1)
    assert isinstance(sched, flash_mla.FlashMLASchedMeta) and splits is None


def _sparse_ref(q, caches, scale, attn_sink):
    """FlashMLA's sparse decode reference: caches = [(bf16 dequantized [slots, 576], indices, topk_length)]."""
    b, s_q, h_q, _ = q.shape
    kvs, invalid = [], []
    for flat, idx, length in caches:
        topk = idx.shape[-1]
        kv = flat[idx.clamp_min(0).long()]                                  # [b, s_q, topk, 576]
        bad = idx == -1
        if length is not None:
            bad |= torch.arange(topk).view(1, 1, topk) >= length.view(b, 1, 1)
        kvs.append(kv)
        invalid.append(bad)
    kv = torch.cat(kvs, 2).double()
    kv[kv != kv] = 0.0
    bad = torch.cat(invalid, 2)
    logits = torch.einsum("bqhd,bqkd->bqhk", q.double(), kv) * scale
    logits = logits.masked_fill(bad.unsqueeze(2), -math.inf)
    lse = logits.logsumexp(-1)
    out = torch.einsum("bqhk,bqkv->bqhv", torch.exp(logits - lse.unsqueeze(-1)), kv[..., :512])
    if attn_sink is not None:
        out = out * (1.0 / (1.0 + torch.exp(attn_sink.double().view(1, 1, h_q) - lse))).unsqueeze(-1)
    lonely = lse == -math.inf
    out[lonely] = 0.0
    lse[lonely] = math.inf
    return out, lse.transpose(1, 2)


def _fp8_cache(num_blocks, block_size, nan_from):
    k = (torch.randn(num_blocks, block_size, 1, 576) / 4).to(torch.bfloat16)
    k.view(-1, 576)[nan_from:] = float("nan")                              # unused slots poisoned before quantizing
    quant = flash_mla.quantize_k_cache(k)
    return quant, flash_mla.dequantize_k_cache(quant).view(-1, 576).float()


def _indices(b, s_q, topk, valid_slots):
    idx = torch.randint(0, valid_slots, (b, s_q, topk), dtype=torch.int32)
    idx[torch.rand(b, s_q, topk) < 0.2] = -1
    return idx


def _sparse_decode_with_extras(make_cache, h_q, d, extra_cache, with_extra):
    """A sparse decode (b 3, s_q 2) over a 6 x 64-token cache with an attention sink (head 3 +inf),
    topk_length [64, 10, 0] and, with_extra, an extra cache `make_cache(*extra_cache)` whose last
    argument is its number of valid tokens: (out, lse, ref_out, ref_lse)."""
    b, s_q = 3, 2
    cache, flat = make_cache(6, 64, nan_from=300)
    idx = _indices(b, s_q, 64, 300)
    topk_length = torch.tensor([64, 10, 0], dtype=torch.int32)
    attn_sink = torch.randn(h_q)
    attn_sink[3] = float("inf")
    extra, extra_flat, extra_idx, extra_len = None, None, None, None
    if with_extra:
        blocks, block_size, valid = extra_cache
        extra, extra_flat = make_cache(blocks, block_size, nan_from=valid)
        extra_idx = _indices(b, s_q, 16, valid)
        extra_len = torch.tensor([3, 16, 0], dtype=torch.int32)
    q = torch.randn(b, s_q, h_q, d).to(torch.bfloat16)
    sched, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, sched, None, is_fp8_kvcache=True,
                                                indices=idx, attn_sink=attn_sink, extra_k_cache=extra,
                                                extra_indices_in_kvcache=extra_idx, topk_length=topk_length,
                                                extra_topk_length=extra_len)
    parts = [(flat, idx, topk_length)] + ([(extra_flat, extra_idx, extra_len)] if with_extra else [])
    ref_out, ref_lse = _sparse_ref(q, parts, d ** -0.5, attn_sink)
    return out, lse, ref_out, ref_lse


@pytest.mark.parametrize("with_extra", [False, True])
def test_sparse_decode_with_sink_topk_length_and_extra_cache(with_extra):
    out, lse, ref_out, ref_lse = _sparse_decode_with_extras(_fp8_cache, 16, 576, (5, 32, 100), with_extra)
    _allclose(out, ref_out, OUT_ABS, OUT_REL)
    _allclose(lse, ref_lse, LSE_ABS, LSE_REL)
    assert not out[:, :, 3].any()                                          # +inf sink: that head's output is 0
    assert not out[2].any() and torch.isposinf(lse[2]).all()              # topk_length 0: no key at all


def test_sparse_decode_refuses_causal_and_dense_refuses_sparse_extras():
    cache, _ = _fp8_cache(2, 64, nan_from=128)
    q = torch.randn(1, 1, 16, 576).to(torch.bfloat16)
    idx = _indices(1, 1, 8, 64)
    with pytest.raises(pk.ContractError, match="causal"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, flash_mla.get_mla_metadata()[0], None, causal=True,
                                         is_fp8_kvcache=True, indices=idx)
    blocked, table, lengths = _paged([10], 64)
    with pytest.raises(pk.ContractError, match="attn_sink"):
        flash_mla.flash_mla_with_kvcache(q, blocked, table, lengths, 512, flash_mla.get_mla_metadata()[0], None,
                                         attn_sink=torch.zeros(16))


# -- prefill -----------------------------------------------------------------------------------------

def test_sparse_prefill_matches_flashmla_reference():
    s_q, h_q, s_kv, topk = 6, 16, 50, 32
    q = torch.randn(s_q, h_q, 576).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, 576).to(torch.bfloat16)
    idx = torch.randint(-1, s_kv + 5, (s_q, 1, topk), dtype=torch.int32)   # -1 and >= s_kv are invalid
    topk_length = torch.randint(0, topk + 1, (s_q,), dtype=torch.int32)
    sink = torch.randn(h_q)
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.05, 512, sink, topk_length)
    indices = idx.squeeze(1).clone()
    indices[torch.arange(topk).expand(s_q, topk) >= topk_length.unsqueeze(1)] = -1
    bad = (indices < 0) | (indices >= s_kv)
    indices[bad] = 0
    gathered = kv.double().index_select(0, indices.flatten().long()).view(s_q, topk, 576)
    logits = (q.double() @ gathered.transpose(1, 2)) * 0.05
    logits[bad.unsqueeze(1).expand(logits.shape)] = -math.inf
    ref_lse = logits.logsumexp(-1)
    ref_max = logits.amax(-1)
    lse_o = torch.logsumexp(torch.stack([ref_lse, sink.double().expand(s_q, h_q)]), 0)
    lse_o[lse_o == -math.inf] = math.inf
    ref_out = torch.exp(logits - lse_o.unsqueeze(-1)) @ gathered[..., :512]
    ref_lse[ref_lse == -math.inf] = math.inf
    _allclose(out, ref_out, OUT_ABS, OUT_REL)
    _allclose(lse, ref_lse, LSE_ABS, LSE_REL)
    _allclose(max_logits, ref_max, LSE_ABS, LSE_REL)


def test_varlen_prefill_matches_sdpa_per_sequence():
    lengths_q, lengths_k = [5, 9], [12, 9]
    cu_q = torch.tensor([0, 5, 14], dtype=torch.int32)
    cu_k = torch.tensor([0, 12, 21], dtype=torch.int32)
    q = (torch.randn(14, 8, 192) / 10).to(torch.bfloat16)
    k = (torch.randn(21, 2, 192) / 10).to(torch.bfloat16)
    v = (torch.randn(21, 2, 128) / 10).to(torch.bfloat16)
    scale = (192 + 100) ** -0.5
    out, lse = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 12, softmax_scale=scale, causal=True)
    for i in range(2):
        qi, ki, vi = q[cu_q[i]:cu_q[i + 1]], k[cu_k[i]:cu_k[i + 1]], v[cu_k[i]:cu_k[i + 1]]
        logits = torch.einsum("qhd,khd->hqk", qi.double(), ki.double().repeat_interleave(4, 1)) * scale
        logits = logits.masked_fill(~torch.ones(lengths_q[i], lengths_k[i], dtype=torch.bool)
                                    .tril(lengths_k[i] - lengths_q[i]), -math.inf)
        ref = torch.einsum("hqk,khv->qhv", logits.softmax(-1), vi.double().repeat_interleave(4, 1))
        _allclose(out[cu_q[i]:cu_q[i + 1]], ref, 1e-3, 8.01 / 128)
        _allclose(lse[cu_q[i]:cu_q[i + 1]], logits.logsumexp(-1).T, 1e-6, 2.01 / 65536)
    packed, _ = flash_mla.flash_attn_varlen_kvpacked_func(q, torch.cat((k, v), -1), cu_q, cu_k, 9, 12, 192,
                                                          softmax_scale=scale, causal=True)
    assert torch.equal(packed, out)
    with pytest.raises(pk.ContractError, match="dropout_p"):
        flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 12, dropout_p=0.1)


def test_upstream_module_path_flash_mla_interface():
    import importlib

    module = importlib.import_module("portable_kernels.flash_mla.flash_mla_interface")
    for name in module.__all__:
        assert getattr(module, name) is getattr(flash_mla, name), name
    assert flash_mla.__version__ == "1.0.0"


# -- MODEL1 (DeepSeek-V4: d_qk = d_v = 512, 584-byte tokens) -------------------------------------------

def _model1_cache(num_blocks, block_size, nan_from):
    """FlashMLA's test's MODEL1 cache: NaN-poisoned unused slots, pages padded to 576-byte multiples."""
    k = (torch.randn(num_blocks, block_size, 1, 512) / 4).to(torch.bfloat16)
    k.view(-1, 512)[nan_from:] = float("nan")
    quant = fm_quantize_model1(k).view(torch.float8_e4m3fn)
    return quant, flash_mla.dequantize_k_cache(quant, MODEL1).view(-1, 512).float()


@pytest.mark.parametrize("with_extra", [False, True])
def test_model1_sparse_decode_with_sink_topk_length_and_extra_cache(with_extra):
    b, s_q, h_q = 3, 2, 64
    out, lse, ref_out, ref_lse = _sparse_decode_with_extras(_model1_cache, h_q, 512, (5, 2, 7), with_extra)
    assert out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q)
    _allclose(out, ref_out, OUT_ABS, OUT_REL)
    _allclose(lse, ref_lse, LSE_ABS, LSE_REL)
    assert pk.calc_diff(out.double(), ref_out) < 5e-6
    assert not out[:, :, 3].any()
    assert not out[2].any() and torch.isposinf(lse[2]).all()


def test_model1_cache_needs_q_of_head_dim_512():
    cache, _ = _model1_cache(2, 64, nan_from=128)
    q = torch.randn(1, 1, 16, 576).to(torch.bfloat16)
    with pytest.raises(pk.ContractError, match="512 for the MODEL1 cache"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, flash_mla.get_mla_metadata()[0], None,
                                         is_fp8_kvcache=True, indices=_indices(1, 1, 8, 64))
