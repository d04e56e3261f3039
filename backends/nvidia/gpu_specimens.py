"""The launches `portable_kernels gpu-report` compiles (the nvidia backend owns them: the tool loads
this module by name, so the semantic layer imports no backend): per Triton kernel a few specimens, small CPU tensors of
the dtypes and layouts a real call has (each variant flag that changes the kernel's code), and for
the GEMMs each autotune config (the first, CONFIGS[0], is the default: what the size heuristic
picks for M above 64 and what CI compiles).

Each family yields (config index or None, specimen name, call); call it before taking the next one
(the lambdas read the loop's current config). Under aot.compiling_for a call compiles, runs nothing.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from .kernels import (bf16_gemm, block_cast, cast_fp4, cast_fp8, cast_fp8_channel, fp8_fp4_gemm, fp8_gemm, grouped_contiguous, hc_prenorm_gemm, k_grouped,
                                        grouped_masked, mla_decode, mla_metadata, mla_sparse_prefill, moe_expand, moe_gate, moe_reduce,
                                        ep_layout, moe_indices, moe_mapping, moe_normalize, moe_select,
                                        mqa_logits, paged_mqa_logits, swiglu_cast, topk, varlen_attention)

Specimen = tuple[int | None, str, Callable[[], object]]

E4M3 = torch.float8_e4m3fn


def _fp8(*shape):
    return torch.zeros(*shape, dtype=E4M3)


def gemm_specimens(all_configs: bool):
    def pick(configs):
        return enumerate(configs if all_configs else configs[:1])

    for index, cfg in pick(fp8_gemm.CONFIGS):
        for packed in (False, True):
            sfa = torch.zeros(256, 1, dtype=torch.int32) if packed else torch.zeros(256, 2)
            sfb = torch.zeros(512, 1, dtype=torch.int32) if packed else torch.zeros(4, 2)
            gran_b = (1, 128) if packed else (128, 128)
            yield (index, f"fp8_gemm packed={packed}", lambda: fp8_gemm.fp8_gemm_nt(
                _fp8(256, 256), sfa, _fp8(512, 256), sfb, torch.empty(256, 512, dtype=torch.bfloat16),
                torch.zeros(256, 512), gran_b=gran_b, config=cfg))
    for index, cfg in pick(bf16_gemm.CONFIGS):
        yield (index, "bf16_gemm", lambda: bf16_gemm.bf16_gemm_nt(
            torch.zeros(256, 256, dtype=torch.bfloat16), torch.zeros(512, 256, dtype=torch.bfloat16),
            torch.empty(256, 512), config=cfg))
        yield (index, "bf16_gemm tn (both MN-major)", lambda: bf16_gemm.bf16_gemm_nt(
            torch.zeros(256, 256, dtype=torch.bfloat16).mT, torch.zeros(256, 512, dtype=torch.bfloat16).mT,
            torch.empty(256, 512), config=cfg))
    for index, cfg in pick(fp8_fp4_gemm.CONFIGS):
        yield (index, "fp8_fp4_gemm", lambda: fp8_fp4_gemm.fp8_fp4_gemm_nt(
            _fp8(256, 256), torch.zeros(256, 1, dtype=torch.int32), torch.zeros(512, 128, dtype=torch.uint8),
            torch.zeros(512, 2, dtype=torch.int32), torch.empty(256, 512, dtype=torch.bfloat16),
            gran_a=(1, 128), gran_b=(1, 32), config=cfg))
    for splits in (None, 16):  # DeepGEMM's shapes: N = 24, K = 7168
        lead = () if splits is None else (splits,)
        yield (None, f"hc_prenorm_gemm splits={splits}", lambda: hc_prenorm_gemm.tf32_hc_prenorm_gemm(
            torch.zeros(256, 7168, dtype=torch.bfloat16), torch.zeros(24, 7168), torch.empty(*lead, 256, 24),
            torch.empty(*lead, 256), splits))
    m_indices = torch.zeros(256, dtype=torch.int32)
    for index, cfg in pick(grouped_contiguous.CONFIGS):
        for psum in (False, True):
            layout = torch.tensor([256, 256], dtype=torch.int32) if psum else m_indices
            yield (index, f"grouped_contiguous fp8 psum={psum}", lambda: grouped_contiguous.m_grouped_gemm_nt_contiguous(
                _fp8(256, 256), _fp8(2, 512, 256), torch.empty(256, 512, dtype=torch.bfloat16), layout,
                sfa=torch.zeros(256, 2), sfb=torch.zeros(2, 4, 2), use_psum_layout=psum, config=cfg))
        yield (index, "grouped_contiguous bf16", lambda: grouped_contiguous.m_grouped_gemm_nt_contiguous(
            torch.zeros(256, 256, dtype=torch.bfloat16), torch.zeros(2, 512, 256, dtype=torch.bfloat16),
            torch.empty(256, 512, dtype=torch.bfloat16), m_indices, config=cfg))
        yield (index, "grouped_contiguous bf16 psum align=224", lambda: grouped_contiguous.m_grouped_gemm_nt_contiguous(
            torch.zeros(256, 256, dtype=torch.bfloat16), torch.zeros(2, 512, 256, dtype=torch.bfloat16),
            torch.empty(256, 512, dtype=torch.bfloat16), torch.tensor([200, 256], dtype=torch.int32),
            use_psum_layout=True, alignment=224, config=cfg))
    for index, cfg in pick(grouped_masked.CONFIGS):
        yield (index, "grouped_masked fp8 sm100", lambda: grouped_masked.m_grouped_gemm_nt_masked(
            _fp8(2, 128, 256), _fp8(2, 512, 256), torch.empty(2, 128, 512, dtype=torch.bfloat16),
            torch.zeros(2, dtype=torch.int32), 64, sfa=torch.zeros(2, 128, 1, dtype=torch.int32),
            sfb=torch.zeros(2, 512, 1, dtype=torch.int32), gran_b=(1, 128), config=cfg))
        yield (index, "grouped_masked bf16", lambda: grouped_masked.m_grouped_gemm_nt_masked(
            torch.zeros(2, 128, 256, dtype=torch.bfloat16), torch.zeros(2, 512, 256, dtype=torch.bfloat16),
            torch.empty(2, 128, 512), torch.zeros(2, dtype=torch.int32), 64, config=cfg))
    ks = torch.tensor([256, 256], dtype=torch.int32)  # K-grouped: G = 2 groups of 256 rows, d [2, 256, 512]
    for index, cfg in pick(k_grouped.FP8_CONFIGS):
        for psum in (False, True):
            layout = torch.tensor([256, 512], dtype=torch.int32) if psum else ks
            yield (index, f"k_grouped fp8 tn psum={psum}", lambda: k_grouped.k_grouped_gemm(
                _fp8(512, 256), _fp8(512, 512), torch.empty(2, 256, 512), layout, torch.zeros(2, 256, 512),
                layout="tn", sfa=torch.zeros(4, 256), sfb=torch.zeros(4, 512), use_psum_layout=psum, config=cfg))
        yield (index, "k_grouped fp8 nt", lambda: k_grouped.k_grouped_gemm(
            _fp8(512 * 256), _fp8(512 * 512), torch.empty(2, 256, 512), ks, layout="nt", ks=(256, 256),
            sfa=torch.zeros(4, 256).T, sfb=torch.zeros(4, 512).T, config=cfg))
    for index, cfg in pick(k_grouped.CONFIGS):
        yield (index, "k_grouped bf16 tn", lambda: k_grouped.k_grouped_gemm(
            torch.zeros(512, 256, dtype=torch.bfloat16), torch.zeros(512, 512, dtype=torch.bfloat16),
            torch.empty(2, 256, 512), ks, torch.zeros(2, 256, 512), layout="tn", config=cfg))


def cast_specimens(all_configs: bool):
    x = torch.zeros(64, 512, dtype=torch.bfloat16)
    for form in ("plain", "sm90", "sm100"):
        yield (None, f"cast_fp8 token {form}", lambda: cast_fp8.cast_to_fp8(x, (1, 128), True, form))
        yield (None, f"cast_fp8 block {form}", lambda: cast_fp8.cast_to_fp8(x, (128, 128), True, form))
        yield (None, f"cast_fp4 {form}", lambda: cast_fp4.cast_to_fp4(x, 32, True, form))
    yield (None, "cast_fp4 deep_gemm", lambda: cast_fp4.cast_to_fp4(x, 32, True, "sm100", convention="deep_gemm"))
    yield (None, "cast_fp8 token x*(1/sf)", lambda: cast_fp8.cast_to_fp8(x, (1, 128), False, "sm90", multiply_by_inverse=True))
    weights = torch.zeros(2, 512, 384, dtype=torch.bfloat16)  # per channel: [G, K, N], scales per 128 rows of K
    yield (None, "cast_fp8 channel ue8m0", lambda: cast_fp8_channel.per_channel_cast_to_fp8(weights, 128, True))
    yield (None, "cast_fp8 channel x*(1/sf)", lambda: cast_fp8_channel.per_channel_cast_to_fp8(
        weights, 128, False, multiply_by_inverse=True))
    yield (None, "swiglu_cast", lambda: swiglu_cast.swiglu_cast(
        x, 128, True, torch.zeros(64, dtype=torch.int32), torch.zeros(8, 8), torch.zeros(64, dtype=torch.int32),
        10.0, torch.zeros(3, dtype=torch.int64), "sm100"))
    yield (None, "swiglu_cast plain", lambda: swiglu_cast.swiglu_cast(x, 256, False))


def block_cast_specimens(all_configs: bool):
    x = torch.zeros(256, 7168, dtype=torch.bfloat16)
    for element, block, round_sf in (("e4m3", (1, 128), True), ("e4m3", (1, 128), False), ("e4m3", (128, 128), True),
                                     ("e4m3", (128, 1), False), ("e2m1", (1, 32), True), ("e2m1", (1, 128), False),
                                     ("e2m1", (128, 1), False), ("e2m1", (128, 128), True)):
        yield (None, f"block_cast {element} {block[0]}x{block[1]}{' round_sf' if round_sf else ''}",
               lambda: block_cast.block_cast(x, block, element, round_sf, 1e-4))
    yield (None, "block_cast e4m3 1x128 given sf", lambda: block_cast.block_cast(
        x, (1, 128), "e4m3", False, 1e-4, torch.ones(256, 56)))


def topk_specimens(all_configs: bool):
    for dtype in (torch.float32, torch.bfloat16):
        for sorted_ in (False, True):
            yield (None, f"topk {dtype} sorted={sorted_}", lambda: topk.topk(
                torch.zeros(4, 32768, dtype=dtype), 2048, torch.zeros(4, dtype=torch.int32), sorted=sorted_))


def mla_specimens(all_configs: bool):
    b, s_q, h_q = 2, 1, 128
    seqlens = torch.tensor([100, 5000], dtype=torch.int32)
    meta, splits = mla_metadata.mla_schedule(seqlens, 8)
    out = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16)
    lse = torch.empty(b, h_q, s_q)
    q = torch.zeros(b, s_q, h_q, 576, dtype=torch.bfloat16)
    table = torch.zeros(b, 80, dtype=torch.int32)
    bf16_cache = torch.zeros(160, 64, 1, 576, dtype=torch.bfloat16)
    fp8_cache = torch.zeros(160, 64, 1, 656, dtype=torch.uint8)
    for split_p in (True, False):
        yield (None, f"mla dense bf16 split_p={split_p}", lambda: mla_decode.flash_mla_with_kvcache(
            q, bf16_cache, table, seqlens, 0.04, False, False, None, meta, splits, out, lse, split_p=split_p))
    half_q, half_cache = q.half(), bf16_cache.half()
    half_out = torch.empty(b, s_q, h_q, 512, dtype=torch.float16)
    yield (None, "mla dense fp16", lambda: mla_decode.flash_mla_with_kvcache(
        half_q, half_cache, table, seqlens, 0.04, False, False, None, meta, splits, half_out, lse))
    yield (None, "mla dense fp8 causal", lambda: mla_decode.flash_mla_with_kvcache(
        q, fp8_cache, table, seqlens, 0.04, True, True, None, meta, splits, out, lse))
    indices = torch.zeros(b, s_q, 2048, dtype=torch.int32)
    yield (None, "mla sparse fp8", lambda: mla_decode.flash_mla_with_kvcache(
        q, fp8_cache, None, None, 0.04, False, True, indices, meta, splits, out, lse))


def mla_prefill_specimens(all_configs: bool):
    # DeepSeek-V3.2's sparse prefill: top-2048 of the kv rows per token; each head-tile size and flag
    s_q, s_kv, topk = 4, 8192, 2048
    indices = torch.zeros(s_q, 1, topk, dtype=torch.int32)
    for h_q, d, dtype, sink, length in ((128, 576, torch.bfloat16, True, True), (64, 576, torch.bfloat16, False, False),
                                        (128, 512, torch.float16, True, False)):
        flags = "".join((" sink" if sink else "", " topk_length" if length else ""))
        q, kv = torch.zeros(s_q, h_q, d, dtype=dtype), torch.zeros(s_kv, 1, d, dtype=dtype)
        out, stats = torch.empty(s_q, h_q, 512, dtype=dtype), torch.empty(s_q, h_q)
        attn_sink = torch.zeros(h_q) if sink else None
        lengths = torch.zeros(s_q, dtype=torch.int32) if length else None
        yield (None, f"mla sparse prefill h={h_q} d={d} {'fp16' if dtype == torch.float16 else 'bf16'}{flags}",
               lambda: mla_sparse_prefill.flash_mla_sparse_fwd(q, kv, indices, 0.04, attn_sink, lengths, out, stats,
                                                               stats.clone()))


def varlen_specimens(all_configs: bool):
    # DeepSeek's dense prefill (MHA over decompressed MLA: d 192 = 128 + 64 RoPE, d_v 128), GQA, the
    # 64-row tile of d_v 256 and a padded (masked) head dim; causal and not, bf16 and fp16
    lengths = torch.tensor([0, 100, 256], dtype=torch.int32)  # b = 2: cu_seqlens of 100 and 156 rows
    for h_q, h_kv, d, d_v, dtype, causal in ((128, 128, 192, 128, torch.bfloat16, True),
                                              (32, 8, 128, 128, torch.float16, False),
                                              (16, 16, 256, 256, torch.bfloat16, True),
                                              (16, 4, 96, 64, torch.bfloat16, False)):
        q = torch.zeros(256, h_q, d, dtype=dtype)
        k, v = torch.zeros(256, h_kv, d, dtype=dtype), torch.zeros(256, h_kv, d_v, dtype=dtype)
        out, lse = torch.empty(256, h_q, d_v, dtype=dtype), torch.empty(256, h_q)
        yield (None, f"varlen h={h_q}/{h_kv} d={d}/{d_v} {'fp16' if dtype == torch.float16 else 'bf16'} "
                     f"causal={causal}", lambda: varlen_attention.flash_attn_varlen_func(
                         q, k, v, lengths, lengths, 156, 0.07, causal, out, lse))


def routing_specimens(all_configs: bool):
    logits = torch.zeros(64, 256)
    yield (None, "moe_gate grouped sigmoid", lambda: moe_gate.top2_sum_gate(
        logits, torch.zeros(256), 8, 4, 8, 2.5, "sigmoid", True, torch.ones(64, dtype=torch.bool)))
    yield (None, "moe_gate sqrtsoftplus", lambda: moe_gate.top2_sum_gate(logits, None, 8, 0, 0, 1.0, "sqrtsoftplus"))
    yield (None, "moe_gate softmax fixed routes", lambda: moe_gate.top2_sum_gate(
        logits, torch.zeros(256), 8, 4, 8, 1.0, "softmax", True, None, torch.zeros(64, 8, dtype=torch.int64),
        torch.zeros(64, dtype=torch.bool)))
    ttp = torch.zeros(64, 8, dtype=torch.int32)
    pte = torch.zeros(1024, dtype=torch.int32)
    yield (None, "moe_expand fp8 with sf", lambda: moe_expand.expand_to_fused(
        _fp8(64, 7168), torch.zeros(64, 56), ttp, pte, _fp8(1024, 7168), torch.zeros(56, 1024).T))
    yield (None, "moe_expand bf16", lambda: moe_expand.expand_to_fused(
        torch.zeros(64, 7168, dtype=torch.bfloat16), None, ttp, pte, torch.zeros(1024, 7168, dtype=torch.bfloat16),
        None))
    x = torch.zeros(1024, 7168, dtype=torch.bfloat16)
    yield (None, "moe_reduce bf16 weighted", lambda: moe_reduce.reduce_fused(
        x, torch.zeros(1024), torch.zeros(64, 8), ttp, None, False, torch.empty(64, 7168, dtype=torch.bfloat16)))
    yield (None, "moe_reduce fp8", lambda: moe_reduce.reduce_fused(
        x.float(), None, None, ttp, torch.ones(1), True, _fp8(64, 7168)))
    yield (None, "moe_normalize", lambda: moe_normalize.normalize_weight(torch.zeros(64, 8)))
    for dtype in (torch.int64, torch.int32):  # each mapping / layout call launches every kernel of its module
        idx = torch.zeros(4096, 8, dtype=dtype)
        yield (None, f"moe_mapping {str(dtype)[6:]}", lambda: moe_mapping.get_fused_mapping(idx, 256, 65536, 128))
        yield (None, f"ep_layout {str(dtype)[6:]}", lambda: ep_layout.get_dispatch_layout(idx, 256, 8))
        ids = torch.zeros(4096, 9, dtype=dtype)
        yield (None, f"moe_indices mask_by_tp {str(dtype)[6:]}", lambda: moe_indices.mask_indices_by_tp(
            ids, 288, 8, 1, 2))
        yield (None, f"moe_indices physical_map {str(dtype)[6:]}", lambda: moe_indices.map_to_physical_experts(
            ids, torch.zeros(257, 33, dtype=torch.int32), torch.ones(257, dtype=torch.int32), 0))
    yield (None, "moe_indices unique_groups", lambda: moe_indices.inplace_unique_group_indices(
        torch.zeros(4096, 8, dtype=torch.int64)))
    yield (None, "moe_select topk_gate", lambda: moe_select.topk_gate(torch.zeros(4096, 256), 8))
    yield (None, "moe_select group_select", lambda: moe_select.topk_sum_and_topk_group_idx(
        torch.zeros(4096, 8, 32), 2, 4))


def indexer_specimens(all_configs: bool):
    ranges = (torch.zeros(256, dtype=torch.int32), torch.full((256,), 4096, dtype=torch.int32))
    for heads, d in ((64, 128), (32, 256), (4, 32)):
        for dtype in (torch.float32, torch.bfloat16):
            yield (None, f"mqa_logits h={heads} d={d} {str(dtype)[6:]}", lambda: mqa_logits.mqa_logits(
                _fp8(256, heads, d), _fp8(4096, d), torch.zeros(4096), torch.zeros(256, heads, dtype=dtype),
                *ranges, False, torch.empty(256, 4352, dtype=dtype)[:, :4096]))
    yield (None, "mqa_logits compressed", lambda: mqa_logits.mqa_logits(
        _fp8(256, 64, 128), _fp8(4096, 128), torch.zeros(4096), torch.zeros(256, 64), *ranges, True,
        torch.empty(256, 4096)))
    table = torch.zeros(8, 64, dtype=torch.int32)
    for heads, next_n, block_kv in ((64, 1, 64), (64, 2, 64), (32, 4, 16)):
        for dtype in (torch.float32, torch.bfloat16):
            yield (None, f"paged_mqa_logits h={heads} n={next_n} kv={block_kv} {str(dtype)[6:]}",
                   lambda: paged_mqa_logits.paged_mqa_logits(
                       _fp8(8, next_n, heads, 128), torch.zeros(64, block_kv, 1, 132, dtype=torch.uint8),
                       torch.zeros(8 * next_n, heads, dtype=dtype), torch.zeros(8, next_n, dtype=torch.int32),
                       table, torch.empty(8 * next_n, 4096, dtype=dtype)))


SPECIMENS = (gemm_specimens, cast_specimens, block_cast_specimens, topk_specimens, mla_specimens, mla_prefill_specimens, varlen_specimens,
             routing_specimens, indexer_specimens)


def all_specimens(all_configs: bool) -> Iterator[Specimen]:
    """Every specimen of every family, in SPECIMENS order."""
    for family in SPECIMENS:
        yield from family(all_configs)
