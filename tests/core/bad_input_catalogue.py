"""The bad-input catalogue: for every public function, inputs it must refuse, with the error type
and the argument the message must name. `tests/core/test_bad_inputs.py` runs it as one parametrized test
per op family; `python tests/core/bad_input_catalogue.py` classifies every entry (typed and naming the
argument / typed without the argument / untyped exception / accepted) and prints counts per family —
run it against an older checkout to see what changed.

Each entry builds its own inputs inside the call (seeded), so a failure to even build them counts
against the library, as a user would see it.
"""

from __future__ import annotations

import io
import sys
from collections import Counter
from typing import Any, Callable, NamedTuple

import torch

import portable_kernels as pk


class Bad(NamedTuple):
    family: str
    name: str
    call: Callable[[], Any]
    arg: str | None            # the argument the message must name ('x' -> "'x'"); None: no name required
    error: type = pk.ContractError


CATALOGUE: list[Bad] = []


def bad(family: str, name: str, arg: str | None, error: type = pk.ContractError):
    def add(call: Callable[[], Any]) -> Callable[[], Any]:
        CATALOGUE.append(Bad(family, name, call, arg, error))
        return call
    return add


def rnd(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _a(m: int = 4, k: int = 256, **kw: Any) -> pk.QuantTensor:
    return pk.per_token_cast_to_fp8(rnd(m, k, seed=1), **kw)


def _b(n: int = 8, k: int = 256, **kw: Any) -> pk.QuantTensor:
    return pk.per_block_cast_to_fp8(rnd(n, k, seed=2), **kw)


def _d(m: int = 4, n: int = 8, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(m, n, dtype=dtype)


def _nan(*shape: int) -> torch.Tensor:
    x = rnd(*shape, seed=3)
    x.view(-1)[5] = float("nan")
    return x


# -- quantization -------------------------------------------------------------------------------------
Q = "quantization"
bad(Q, "per_token x int32", "x")(lambda: pk.per_token_cast_to_fp8(torch.ones(4, 8, dtype=torch.int32)))
bad(Q, "per_token x 1-D", "x")(lambda: pk.per_token_cast_to_fp8(torch.ones(8)))
bad(Q, "per_token x 4-D", "x")(lambda: pk.per_token_cast_to_fp8(torch.ones(2, 2, 2, 8)))
bad(Q, "per_token x a list", "x")(lambda: pk.per_token_cast_to_fp8([[1.0]]))
bad(Q, "per_token gran_k 0", "gran_k")(lambda: pk.per_token_cast_to_fp8(torch.ones(4, 8), gran_k=0))
bad(Q, "per_token gran_k True", "gran_k")(lambda: pk.per_token_cast_to_fp8(torch.ones(4, 8), gran_k=True))
bad(Q, "per_token gran_k 1.5", "gran_k")(lambda: pk.per_token_cast_to_fp8(torch.ones(4, 8), gran_k=1.5))
bad(Q, "per_token use_ue8m0 'yes'", "use_ue8m0")(lambda: pk.per_token_cast_to_fp8(torch.ones(4, 8), use_ue8m0="yes"))
bad(Q, "per_token NaN with ue8m0", "x")(lambda: pk.per_token_cast_to_fp8(_nan(4, 256), use_ue8m0=True))
bad(Q, "per_token Inf with ue8m0", "x")(
    lambda: pk.per_token_cast_to_fp8(torch.full((2, 128), float("inf")), use_ue8m0=True))
bad(Q, "per_token prepare_for unknown op", "prepare_for")(
    lambda: pk.per_token_cast_to_fp8(torch.ones(2, 128), prepare_for="no_such_op"))
bad(Q, "per_token prepare_for unknown argument", "arg")(
    lambda: pk.per_token_cast_to_fp8(torch.ones(2, 128), prepare_for=pk.fp8_gemm_nt, arg="z"))
bad(Q, "per_token prepare_for an exponent format without ue8m0", "a", pk.LayoutError)(
    lambda: _use("nvidia", lambda: pk.per_token_cast_to_fp8(rnd(2, 128), prepare_for=pk.fp8_gemm_nt), arch="sm100"))
bad(Q, "per_block block of one", "block")(lambda: pk.per_block_cast_to_fp8(torch.ones(4, 8), block=(128,)))
bad(Q, "per_block block 0", "block[0]")(lambda: pk.per_block_cast_to_fp8(torch.ones(4, 8), block=(0, 128)))
bad(Q, "per_block x float64", "x")(lambda: pk.per_block_cast_to_fp8(torch.ones(4, 8, dtype=torch.float64)))
bad(Q, "per_block NaN with ue8m0", "x")(lambda: pk.per_block_cast_to_fp8(_nan(128, 256), use_ue8m0=True))
bad(Q, "fp4 odd K", "x")(lambda: pk.per_token_cast_to_fp4(torch.ones(4, 7)))
bad(Q, "fp4 gran_k 0", "gran_k")(lambda: pk.per_token_cast_to_fp4(torch.ones(4, 8), gran_k=0))
bad(Q, "fp4 NaN", "x")(lambda: pk.per_token_cast_to_fp4(_nan(4, 64)))
bad(Q, "fp4 use_ue8m0 'x'", "use_ue8m0")(lambda: pk.per_token_cast_to_fp4(torch.ones(4, 8), use_ue8m0="x"))
bad(Q, "swiglu odd last dim", "x")(lambda: pk.swiglu_forward_and_per_token_cast(torch.ones(4, 7)))
bad(Q, "swiglu fmt e5m2", "fmt")(lambda: pk.swiglu_forward_and_per_token_cast(torch.ones(4, 8), fmt="e5m2"))
bad(Q, "swiglu num_per_channels 0", "num_per_channels")(
    lambda: pk.swiglu_forward_and_per_token_cast(torch.ones(4, 8), num_per_channels=0))
bad(Q, "swiglu weights without positions", "pos_to_token_topk")(
    lambda: pk.swiglu_forward_and_per_token_cast(torch.ones(4, 8), topk_weights=torch.ones(4, 1)))
bad(Q, "swiglu negative clamp", "swiglu_clamp_value")(
    lambda: pk.swiglu_forward_and_per_token_cast(torch.ones(4, 8), swiglu_clamp_value=-1.0))
bad(Q, "swiglu NaN with round_sf", "x")(
    lambda: pk.swiglu_forward_and_per_token_cast(_nan(4, 256), round_sf=True))
bad(Q, "dequantize a string", "q")(lambda: pk.dequantize("not a tensor"))
bad(Q, "dequantize a pair with a wrong scale", "q")(lambda: pk.dequantize((_a().data, torch.ones(4, 5))))


def _use(backend: str, fn: Callable[[], Any], **options: Any) -> Any:
    with pk.use_backend(backend, **options):
        return fn()


bad(Q, "block_cast fmt e5m6", "fmt")(lambda: pk.block_cast(rnd(4, 64), "e5m6", (1, 32)))
bad(Q, "block_cast block of 3 edges", "block_size")(lambda: pk.block_cast(rnd(4, 64), "e4m3", (1, 32, 2)))
bad(Q, "block_cast odd K for e2m1", "x")(lambda: pk.block_cast(rnd(4, 63), "e2m1", (1, 32)))
bad(Q, "block_cast NaN for e2m1", "x")(lambda: pk.block_cast(_nan(4, 64), "e2m1", (1, 32)))
bad(Q, "block_cast given scales of a wrong shape", "sf")(
    lambda: pk.block_cast(rnd(4, 64), "e4m3", (1, 32), sf=torch.ones(4, 3)))
bad(Q, "swiglu_forward odd last dim", "x")(lambda: pk.swiglu_forward(rnd(4, 7)))
bad(Q, "swiglu_forward counts without a clamp", "clamped_count")(
    lambda: pk.swiglu_forward(rnd(4, 8), clamped_count=torch.zeros(3, dtype=torch.int64)))

# -- GEMM ----------------------------------------------------------------------------------------------
G = "gemm"
bad(G, "a a plain tensor", "a")(lambda: pk.fp8_gemm_nt(rnd(4, 256), _b(), _d()))
bad(G, "a data not fp8", "a")(lambda: pk.fp8_gemm_nt((_a().data.float(), _a().scale), _b(), _d()))
bad(G, "a scale of a wrong shape", "a")(lambda: pk.fp8_gemm_nt((_a().data, torch.ones(4, 5)), _b(), _d()))
bad(G, "a scale on another device", "a")(
    lambda: pk.fp8_gemm_nt((_a().data, _a().scale.to("meta")), _b(), _d()))
bad(G, "b not a pair", "b")(lambda: pk.fp8_gemm_nt(_a(), (_b().data,), _d()))
bad(G, "mismatched K", "b")(lambda: pk.fp8_gemm_nt(_a(), _b(k=384), _d()))
bad(G, "K = 0", "a")(lambda: pk.fp8_gemm_nt(_a(k=0), _b(k=0), _d()))
bad(G, "K granularities differ", "b")(lambda: pk.fp8_gemm_nt(_a(gran_k=64), _b(), _d()))
bad(G, "d fp16", "d")(lambda: pk.fp8_gemm_nt(_a(), _b(), _d(dtype=torch.float16)))
bad(G, "d of a wrong shape", "d")(lambda: pk.fp8_gemm_nt(_a(), _b(), _d(4, 9)))
bad(G, "d not contiguous", "d")(lambda: pk.fp8_gemm_nt(_a(), _b(), _d(8, 4).T))
bad(G, "d on another device", "d")(lambda: pk.fp8_gemm_nt(_a(), _b(), _d().to("meta")))
bad(G, "c of a wrong shape", "c")(lambda: pk.fp8_gemm_nt(_a(), _b(), _d(), c=torch.zeros(4, 9)))
bad(G, "a 3-D", "a")(lambda: pk.fp8_gemm_nt(pk.per_token_cast_to_fp8(rnd(2, 4, 256)), _b(), _d()))
bad(G, "recipe not the operands'", "recipe")(lambda: pk.fp8_gemm_nt(_a(), _b(), _d(), recipe=(1, 64, 128)))
bad(G, "recipe not a triple", "recipe")(lambda: pk.fp8_gemm_nt(_a(), _b(), _d(), recipe=(1, 128)))
bad(G, "prepared for another backend", None, pk.LayoutError)(
    lambda: _use("cpu", lambda: pk.fp8_gemm_nt(_a(), pk.prepare_inputs(pk.fp8_gemm_nt, backend="nvidia",
                                                                          b=_b())["b"], _d())))
bad(G, "prepared in a format the backend does not store it in", "b", pk.LayoutError)(
    lambda: pk.fp8_gemm_nt(_a(), pk.PreparedTensor.unchecked(_b().data, _b().scale, pk.layouts.SM90, "cpu", (8, 256),
                                                               (128, 128), (128, 128)), _d()))
bad(G, "hand-built PreparedTensor with an inconsistent scale", None, pk.LayoutError)(
    lambda: pk.PreparedTensor(_b().data, torch.ones(3, 3), pk.PLAIN, "cpu", (8, 256), (128, 128), (128, 128)))
bad(G, "hand-built PreparedTensor with a format name", None)(
    lambda: pk.PreparedTensor(_b().data, _b().scale, "fp32-row-major", "cpu", (8, 256), (128, 128), (128, 128)))
def _unpickle_without_its_format() -> Any:
    """Save an operand in a plugin's Format, then load it where that Format is not defined (torch.save:
    plain pickle of fp8 tensors fails inside torch 2.13 itself)."""
    from portable_kernels.layouts import format as fmt_module
    plugin = pk.Format("catalogue-plugin-format", ("e4m3",), "fp32", "as quantized", False, pk.PLAIN.encode,
                       pk.PLAIN.decode, pk.PLAIN.storage_granularity)
    b = _b()
    blob = io.BytesIO()
    torch.save(pk.PreparedTensor(b.data, b.scale, plugin, "cpu", (8, 256), (128, 128), (128, 128)), blob)
    del fmt_module._FORMATS[plugin.name]  # the loading process has no such plugin installed
    blob.seek(0)
    return torch.load(blob, weights_only=False)


bad(G, "unpickled PreparedTensor of an unknown format", None, pk.LayoutError)(_unpickle_without_its_format)
bad(G, "bf16 a fp32", "a")(lambda: pk.bf16_gemm_nt(rnd(4, 16), rnd(8, 16).bfloat16(), _d()))
bad(G, "bf16 b 1-D", "b")(lambda: pk.bf16_gemm_nt(rnd(4, 16).bfloat16(), rnd(16).bfloat16(), _d()))
bad(G, "bf16 mismatched K", "b")(lambda: pk.bf16_gemm_nt(rnd(4, 16).bfloat16(), rnd(8, 17).bfloat16(), _d()))
bad(G, "bf16 d of a wrong shape", "d")(lambda: pk.bf16_gemm_nt(rnd(4, 16).bfloat16(), rnd(8, 16).bfloat16(),
                                                               torch.empty(3, 8)))
bad(G, "fp8_fp4 b in fp8", "b")(lambda: pk.fp8_fp4_gemm_nt(_a(), _b(), _d()))
bad(G, "fp8_fp4 a in fp4", "a")(
    lambda: pk.fp8_fp4_gemm_nt(pk.per_token_cast_to_fp4(rnd(4, 256)), pk.per_token_cast_to_fp4(rnd(8, 256)), _d()))


# -- grouped GEMM ------------------------------------------------------------------------------------------
GG = "grouped_gemm"


def _contig(m_indices: torch.Tensor | None = None, **kw: Any) -> None:
    a = pk.per_token_cast_to_fp8(rnd(256, 128, seed=4))
    b = pk.per_block_cast_to_fp8(rnd(2, 64, 128, seed=5))
    idx = torch.cat([torch.zeros(128, dtype=torch.int32), torch.ones(128, dtype=torch.int32)])
    pk.m_grouped_fp8_gemm_nt_contiguous(a, b, torch.empty(256, 64, dtype=torch.bfloat16),
                                        idx if m_indices is None else m_indices, **kw)


def _masked(masked_m: torch.Tensor | None = None, expected_m: Any = 16, a_shape=(2, 32, 128)) -> None:
    a = pk.per_token_cast_to_fp8(rnd(*a_shape, seed=6))
    b = pk.per_block_cast_to_fp8(rnd(2, 64, 128, seed=7))
    mm = torch.tensor([5, 7], dtype=torch.int32) if masked_m is None else masked_m
    pk.m_grouped_fp8_gemm_nt_masked(a, b, torch.empty(a_shape[0], a_shape[1], 64, dtype=torch.bfloat16), mm,
                                    expected_m)


bad(GG, "m_indices int64", "m_indices")(lambda: _contig(torch.zeros(256, dtype=torch.int64)))
bad(GG, "m_indices too short", "m_indices")(lambda: _contig(torch.zeros(100, dtype=torch.int32)))
bad(GG, "m_indices names group 5 of 2", "m_indices")(lambda: _contig(torch.full((256,), 5, dtype=torch.int32)))
bad(GG, "m_indices segments not aligned", "m_indices")(
    lambda: _contig(torch.cat([torch.zeros(100, dtype=torch.int32), torch.ones(156, dtype=torch.int32)])))
bad(GG, "m_indices groups descending", "m_indices")(
    lambda: _contig(torch.cat([torch.ones(128, dtype=torch.int32), torch.zeros(128, dtype=torch.int32)])))
bad(GG, "psum decreasing", "m_indices")(
    lambda: _contig(torch.tensor([200, 100], dtype=torch.int32), use_psum_layout=True))
bad(GG, "psum past M", "m_indices")(lambda: _contig(torch.tensor([128, 400], dtype=torch.int32), use_psum_layout=True))
bad(GG, "use_psum_layout 'yes'", "use_psum_layout")(
    lambda: _contig(torch.tensor([128, 256], dtype=torch.int32), use_psum_layout="yes"))
bad(GG, "masked_m past max_m", "masked_m")(lambda: _masked(torch.tensor([5, 99], dtype=torch.int32)))
bad(GG, "masked_m negative", "masked_m")(lambda: _masked(torch.tensor([-1, 3], dtype=torch.int32)))
bad(GG, "masked_m float", "masked_m")(lambda: _masked(torch.tensor([5.0, 7.0])))
bad(GG, "expected_m 0", "expected_m")(lambda: _masked(expected_m=0))
bad(GG, "masked a 2-D", "a")(lambda: _masked(a_shape=(32, 128)))
bad(GG, "masked groups differ", "a")(lambda: _masked(a_shape=(3, 32, 128)))
bad(GG, "grouped b 2-D", "b")(lambda: pk.m_grouped_bf16_gemm_nt_masked(
    rnd(2, 8, 16).bfloat16(), rnd(4, 16).bfloat16(), torch.empty(2, 8, 4, dtype=torch.bfloat16),
    torch.tensor([1, 2], dtype=torch.int32), 4))
bad(GG, "grouped bf16 a fp32", "a")(lambda: pk.m_grouped_bf16_gemm_nt_masked(
    rnd(2, 8, 16), rnd(2, 4, 16).bfloat16(), torch.empty(2, 8, 4, dtype=torch.bfloat16),
    torch.tensor([1, 2], dtype=torch.int32), 4))
bad(GG, "alignment of a device that is not here", None, pk.BackendUnavailableError)(
    lambda: pk.get_m_alignment_for_contiguous_layout("npu"))
bad(GG, "alignment of a device that does not exist", "device")(
    lambda: pk.get_m_alignment_for_contiguous_layout("garbage"))


# -- MLA decode --------------------------------------------------------------------------------------------
M = "mla"


def _mla(**change: Any) -> Any:
    q = rnd(1, 1, 16, 576, seed=8).bfloat16()
    cache = rnd(4, 64, 1, 576, seed=9).bfloat16()
    args = dict(q=q, k_cache=cache, block_table=torch.arange(4, dtype=torch.int32)[None],
                cache_seqlens=torch.tensor([200], dtype=torch.int32), head_dim_v=512)
    args.update({k: v for k, v in change.items() if k not in ("meta",)})
    meta = change.get("meta") or pk.get_mla_metadata(torch.tensor([200], dtype=torch.int32), 16, 1)
    return pk.flash_mla_with_kvcache(args.pop("q"), args.pop("k_cache"), args.pop("block_table"),
                                     args.pop("cache_seqlens"), args.pop("head_dim_v"), meta[0], meta[1], **args)


bad(M, "q fp32", "q")(lambda: _mla(q=rnd(1, 1, 16, 576)))
bad(M, "q head dim 100", "q")(lambda: _mla(q=rnd(1, 1, 16, 100).bfloat16()))
bad(M, "k_cache 3-D", "k_cache")(lambda: _mla(k_cache=rnd(4, 64, 576).bfloat16()))
bad(M, "is_fp8_kvcache with a bf16 cache", "is_fp8_kvcache")(lambda: _mla(is_fp8_kvcache=True))
bad(M, "head_dim_v 256", "head_dim_v")(lambda: _mla(head_dim_v=256))
bad(M, "block_table None for dense decode", "block_table")(lambda: _mla(block_table=None))
bad(M, "cache_seqlens int64", "cache_seqlens")(lambda: _mla(cache_seqlens=torch.tensor([200])))
bad(M, "cache_seqlens past the table", "cache_seqlens")(
    lambda: _mla(cache_seqlens=torch.tensor([1000], dtype=torch.int32)))
bad(M, "a used block_table entry outside the cache", "block_table")(
    lambda: _mla(block_table=torch.tensor([[0, 1, 9, 3]], dtype=torch.int32)))
bad(M, "indices with a bf16 cache", "indices")(lambda: _mla(indices=torch.zeros(1, 1, 8, dtype=torch.int32)))
bad(M, "softmax_scale NaN", "softmax_scale")(lambda: _mla(softmax_scale=float("nan")))
bad(M, "metadata not from get_mla_metadata", "tile_scheduler_metadata")(lambda: _mla(meta=("x", None)))
bad(M, "metadata of another configuration", "tile_scheduler_metadata")(
    lambda: _mla(meta=pk.get_mla_metadata(torch.tensor([200], dtype=torch.int32), 32, 1)))
bad(M, "out of a wrong shape", "out")(lambda: _mla(out=torch.empty(1, 1, 16, 256, dtype=torch.bfloat16)))
bad(M, "causal 1", "causal")(lambda: _mla(causal=1))
bad(M, "metadata num_heads_k 0", "num_heads_k")(
    lambda: pk.get_mla_metadata(torch.tensor([200], dtype=torch.int32), 16, 0))
bad(M, "metadata topk without num_heads_q", "topk")(
    lambda: pk.get_mla_metadata(torch.tensor([200], dtype=torch.int32), 16, 1, topk=8))
bad(M, "metadata cache_seqlens fp32", "cache_seqlens")(lambda: pk.get_mla_metadata(torch.tensor([200.0]), 16, 1))


# -- top-k ----------------------------------------------------------------------------------------------
T = "topk"
bad(T, "input int32", "input")(lambda: pk.topk(torch.ones(2, 8, dtype=torch.int32), 2))
bad(T, "input 3-D", "input")(lambda: pk.topk(torch.ones(2, 2, 8), 2))
bad(T, "topk 0", "topk")(lambda: pk.topk(torch.ones(2, 8), 0))
bad(T, "topk 5000", "topk")(lambda: pk.topk(torch.ones(2, 8), 5000))
bad(T, "topk 2.0", "topk")(lambda: pk.topk(torch.ones(2, 8), 2.0))
bad(T, "sorted and sorted_index", "sorted_index")(lambda: pk.topk(torch.ones(2, 8), 2, sorted=True, sorted_index=True))
bad(T, "sorted 'yes'", "sorted")(lambda: pk.topk(torch.ones(2, 8), 2, sorted="yes"))
bad(T, "begin given", "begin")(lambda: pk.topk(torch.ones(2, 8), 2, begin=torch.zeros(2, dtype=torch.int32)))
bad(T, "indices_type float", "indices_type")(lambda: pk.topk(torch.ones(2, 8), 2, indices_type=torch.float32))
bad(T, "idx fill outside int32", "idx_oob_fill_value")(
    lambda: pk.topk(torch.ones(2, 8), 2, indices_type=torch.int32, idx_oob_fill_value=2**40))
bad(T, "value fill outside bf16", "value_oob_fill_value")(
    lambda: pk.topk(torch.ones(2, 8, dtype=torch.bfloat16), 2, value_oob_fill_value=1e39))
bad(T, "end int64", "end")(lambda: pk.topk(torch.ones(2, 8), 2, end=torch.tensor([3, 4])))
bad(T, "end past n", "end")(lambda: pk.topk(torch.ones(2, 8), 2, end=torch.tensor([3, 9], dtype=torch.int32)))
bad(T, "NaN in a valid range", "input")(lambda: pk.topk(_nan(2, 64), 4))


# -- MoE routing --------------------------------------------------------------------------------------------
R = "moe_routing"


def _gate(**change: Any) -> Any:
    args = dict(logits=rnd(4, 16, seed=10), bias=None, num_topk=2, num_topk_groups=2, num_groups=4)
    args.update(change)
    return pk.top2_sum_gate(**args)


def _mapping() -> pk.FusedMapping:
    return pk.get_fused_mapping(torch.tensor([[0, 1], [1, 2]]), 4, alignment=4)


bad(R, "gate logits bf16", "logits")(lambda: _gate(logits=rnd(4, 16).bfloat16()))
bad(R, "gate logits NaN", "logits")(lambda: _gate(logits=_nan(4, 16)))
bad(R, "gate bias of a wrong shape", "bias")(lambda: _gate(bias=torch.zeros(3)))
bad(R, "gate num_groups not dividing E", "num_groups")(lambda: _gate(num_groups=5, num_topk_groups=2))
bad(R, "gate num_topk too large", "num_topk")(lambda: _gate(num_topk=99))
bad(R, "gate num_topk_groups > num_groups", "num_topk_groups")(lambda: _gate(num_topk_groups=9))
bad(R, "gate scoring_func tanh", "scoring_func")(lambda: _gate(scoring_func="tanh"))
bad(R, "gate mask int", "mask")(lambda: _gate(mask=torch.ones(4, dtype=torch.int32)))
bad(R, "normalize_weight int", "topk_weights")(lambda: pk.normalize_weight(torch.ones(4, 2, dtype=torch.int32)))
bad(R, "mapping expert >= E", "topk_idx")(lambda: pk.get_fused_mapping(torch.tensor([[0, 9]]), 4))
bad(R, "mapping num_experts 0", "num_experts")(lambda: pk.get_fused_mapping(torch.tensor([[0, 1]]), 0))
bad(R, "mapping alignment 0", "alignment")(lambda: pk.get_fused_mapping(torch.tensor([[0, 1]]), 4, alignment=0))
bad(R, "mapping buffer too small", "num_expanded_tokens")(
    lambda: pk.get_fused_mapping(torch.tensor([[0, 1]]), 4, num_expanded_tokens=1, alignment=4))
bad(R, "mapping buffer larger than memory", "num_expanded_tokens")(
    lambda: pk.get_fused_mapping(torch.tensor([[0, 1]]), 4, num_expanded_tokens=10**13))
bad(R, "expand x 1-D", "x")(lambda: pk.expand_to_fused(torch.ones(8), _mapping()))
bad(R, "expand inconsistent mapping", "token_topk_to_pos")(
    lambda: pk.expand_to_fused(torch.ones(2, 8), torch.tensor([[0, 0], [4, 8]], dtype=torch.int32),
                               _mapping().pos_to_expert))
bad(R, "expand_with_sf scale of a wrong shape", "x")(
    lambda: pk.expand_to_fused_with_sf((_a(2, 256).data, torch.ones(2, 3)), 128, _mapping()))
bad(R, "reduce fp8_format e5m2", "fp8_format")(
    lambda: pk.reduce_fused(torch.ones(12, 8), None, _mapping(), fp8_format="e5m2"))
bad(R, "reduce sf without fp8", "sf")(lambda: pk.reduce_fused(torch.ones(12, 8), None, _mapping(), sf=torch.ones(1)))
bad(R, "reduce weights of a wrong shape", "topk_weights")(
    lambda: pk.reduce_fused(torch.ones(12, 8), torch.ones(2, 3), _mapping()))
bad(R, "reduce out of a wrong dtype", "out")(
    lambda: pk.reduce_fused(torch.ones(12, 8), None, _mapping(), out=torch.empty(2, 8, dtype=torch.float16)))

bad(R, "gate fix_routing_mask without unmapped_topk_idx", "unmapped_topk_idx")(
    lambda: _gate(fix_routing_mask=torch.ones(4, dtype=torch.bool)))
bad(R, "gate to_physical_map without logical_count", "logical_count")(
    lambda: _gate(to_physical_map=torch.zeros(16, 2, dtype=torch.int32)))
bad(R, "gate tp_rank outside num_tp_ranks", "tp_rank")(lambda: _gate(num_tp_ranks=2, tp_rank=2))
bad(R, "topk_gate k > E", "num_topk")(lambda: pk.topk_gate(rnd(3, 8), 9))
bad(R, "topk_gate NaN", "scores")(lambda: pk.topk_gate(_nan(3, 8), 2))
bad(R, "group select 2-D scores", "scores")(lambda: pk.topk_sum_and_topk_group_idx(rnd(3, 8), 2, 2))
bad(R, "group select num_topk_sum > P", "num_topk_sum")(lambda: pk.topk_sum_and_topk_group_idx(rnd(3, 4, 2), 3, 2))
bad(R, "group_count id >= num_groups", "group_idx")(lambda: pk.group_count(torch.tensor([[0, 5]]), 4))
bad(R, "aux_fi num_aux_topk 0", "num_aux_topk")(lambda: pk.aux_fi(torch.tensor([[0, 1]]), 4, 0))
bad(R, "mask_indices_by_tp n not a multiple of the EP ranks", "n")(
    lambda: pk.mask_indices_by_tp(torch.tensor([[0, 1]]), 10, 4, 0, 2))
bad(R, "unique group indices float", "group_indices")(
    lambda: pk.inplace_unique_group_indices(torch.ones(2, 3), 4))
bad(R, "physical map count past the replicas", "logical_count")(
    lambda: pk.map_to_physical_experts(torch.tensor([[0, 1]]), torch.zeros(2, 2, dtype=torch.int32),
                                       torch.tensor([1, 3], dtype=torch.int32)))


# -- expert parallelism ---------------------------------------------------------------------------------------
E = "ep"
bad(E, "layout num_ranks 0", "num_ranks")(lambda: pk.get_dispatch_layout(torch.tensor([[0, 1]]), 4, 0))
bad(E, "layout num_experts not a multiple of ranks", "num_experts")(
    lambda: pk.get_dispatch_layout(torch.tensor([[0, 1]]), 5, 2))
bad(E, "layout expert >= E", "topk_idx")(lambda: pk.get_dispatch_layout(torch.tensor([[0, 9]]), 4, 2))
bad(E, "layout a repeated expert", "topk_idx")(lambda: pk.get_dispatch_layout(torch.tensor([[1, 1]]), 4, 2))
bad(E, "dispatch expert_alignment 0", "expert_alignment")(
    lambda: pk.simulate_dispatch([rnd(2, 8)], [torch.tensor([[0], [1]])], num_experts=2, expert_alignment=0))
bad(E, "low-latency dispatch buffers larger than memory", "num_max_dispatch_tokens_per_rank")(
    lambda: pk.simulate_low_latency_dispatch([rnd(2, 128)], [torch.tensor([[0], [1]])], 10**9, 2))
bad(E, "low-latency dispatch NaN with round_scale", "xs[0]")(
    lambda: pk.simulate_low_latency_dispatch([_nan(2, 128)], [torch.tensor([[0], [1]])], 4, 2, round_scale=True))


# -- selection, preparation and helpers ----------------------------------------------------------------------------
S = "selection"
bad(S, "use_backend unknown", None, pk.BackendUnavailableError)(lambda: pk.use_backend("nope").__enter__())
bad(S, "use_backend misspelled option", None)(lambda: pk.use_backend("nvidia", archh="sm100").__enter__())
bad(S, "strict_layouts 'no'", "enabled")(lambda: pk.strict_layouts("no").__enter__())
bad(S, "calc_diff complex", "x")(lambda: pk.calc_diff(torch.tensor([1 + 1j]), torch.tensor([1 - 1j])))
bad(S, "prepare_inputs unknown argument", None)(lambda: pk.prepare_inputs(pk.fp8_gemm_nt, z=_b()))
bad(S, "prepare_inputs unknown op", None)(lambda: pk.prepare_inputs("no_such_op", b=_b()))
bad(S, "prepare_inputs on a device that is not here", None, pk.BackendUnavailableError)(
    lambda: pk.prepare_inputs(pk.fp8_gemm_nt, device="cuda", b=_b()))
bad(S, "prepare_inputs non-pow2 scales into an exponent format", "b", pk.LayoutError)(
    lambda: pk.prepare_inputs(pk.fp8_gemm_nt, backend="nvidia", arch="sm100", b=_b()))
bad(S, "QuantTensor granularity 0", None)(lambda: pk.QuantTensor(_a().data, _a().scale, (0, 128)))
bad(S, "QuantTensor scale of a wrong shape", None)(lambda: pk.QuantTensor(_a().data, _a().scale[:, :1], (1, 128)))


# -- the drop-in parity additions (issue 11): new ops and keywords ---------------------------------------------
bad(Q, "per_channel x 1-D", "x")(lambda: pk.per_channel_cast_to_fp8(rnd(8)))
bad(Q, "per_channel gran_k 0", "gran_k")(lambda: pk.per_channel_cast_to_fp8(rnd(8, 8), gran_k=0))
bad(Q, "cast convention unknown", "convention")(lambda: pk.per_token_cast_to_fp8(rnd(4, 8), convention="tile"))
bad(G, "nn b of another K", "b")(lambda: pk.fp8_gemm_nn(_a(), _b(8, 256), _d()))
bad(G, "tn d of a wrong shape", "d")(
    lambda: pk.fp8_gemm_tn((_a().data.T, _a().scale.T), (_b().data.T, _b().scale.T), _d(4, 9)))
bad(G, "bf16 tt a fp32", "a")(lambda: pk.bf16_gemm_tt(rnd(256, 4), rnd(8, 256).bfloat16(), _d()))
bad(G, "packed int32 scale of no possible width", "a")(
    lambda: pk.fp8_gemm_nt((_a().data, torch.zeros(4, 3, dtype=torch.int32)), _b(), _d()))
bad(GG, "fp8_fp4 contiguous with an FP8 weight", "b")(
    lambda: pk.m_grouped_fp8_fp4_gemm_nt_contiguous(_a(256), pk.per_block_cast_to_fp8(rnd(2, 8, 256)),
                                                    _d(256, 8), torch.zeros(256, dtype=torch.int32)))
bad(GG, "ensure_zero_padding 'yes'", "ensure_zero_padding")(
    lambda: pk.m_grouped_bf16_gemm_nt_contiguous(rnd(128, 64).bfloat16(), rnd(1, 8, 64).bfloat16(), _d(128, 8),
                                                 torch.zeros(128, dtype=torch.int32), ensure_zero_padding="yes"))
bad(GG, "k-grouped K not a multiple of the alignment", "ks_cpu")(
    lambda: pk.k_grouped_bf16_gemm_tn_contiguous(rnd(100, 8).bfloat16(), rnd(100, 4).bfloat16(), torch.empty(1, 8, 4),
                                                 [100], torch.tensor([100], dtype=torch.int32)))
bad(GG, "k-grouped recipe (1, 128, 128)", "recipe")(
    lambda: pk.k_grouped_fp8_gemm_tn_contiguous((torch.zeros(128, 8, dtype=torch.float8_e4m3fn), torch.ones(1, 8)),
                                                (torch.zeros(128, 4, dtype=torch.float8_e4m3fn), torch.ones(1, 4)),
                                                torch.empty(1, 8, 4), [128], torch.tensor([128], dtype=torch.int32),
                                                recipe=(1, 128, 128)))
bad(GG, "set_mk_alignment 0", "alignment")(lambda: pk.set_mk_alignment_for_contiguous_layout(0))
bad(M, "attn_sink with dense decode", "attn_sink")(lambda: _mla(attn_sink=torch.zeros(16)))
bad(M, "sparse prefill d_v 256", "d_v")(
    lambda: pk.flash_mla_sparse_fwd(rnd(2, 4, 576).bfloat16(), rnd(8, 1, 576).bfloat16(),
                                    torch.zeros(2, 1, 4, dtype=torch.int32), 0.05, d_v=256))
bad(M, "varlen dropout", "dropout_p")(
    lambda: pk.flash_attn_varlen_func(rnd(4, 2, 64).bfloat16(), rnd(4, 2, 64).bfloat16(), rnd(4, 2, 64).bfloat16(),
                                      torch.tensor([0, 4], dtype=torch.int32), torch.tensor([0, 4], dtype=torch.int32),
                                      4, 4, dropout_p=0.1))
bad(T, "hint given", "hint")(lambda: pk.topk(torch.ones(2, 8), 2, hint=torch.zeros(2, dtype=torch.int32)))
bad(T, "output_idx of another dtype", "output_idx")(
    lambda: pk.topk(torch.ones(2, 8), 2, output_idx=torch.empty(2, 2, dtype=torch.int32)))
bad(T, "output_idx_offset int64", "output_idx_offset")(
    lambda: pk.topk(torch.ones(2, 8), 2, output_idx_offset=torch.zeros(2, dtype=torch.int64)))


def classify(entry: Bad) -> str:
    """'typed' (the expected error naming the argument), 'typed-unnamed' (a PortableKernelsError
    that does not name it, or of another type), 'untyped' (another exception), 'accepted'."""
    try:
        entry.call()
    except pk.PortableKernelsError as exc:
        named = entry.arg is None or f"'{entry.arg}'" in str(exc)
        return "typed" if isinstance(exc, entry.error) and named else "typed-unnamed"
    except Exception:
        return "untyped"
    return "accepted"


def main() -> None:
    import warnings
    warnings.simplefilter("ignore")
    totals: dict[str, Counter] = {}
    for entry in CATALOGUE:
        outcome = classify(entry)
        totals.setdefault(entry.family, Counter())[outcome] += 1
        if outcome != "typed" and "-v" in sys.argv:
            print(f"  {entry.family}: {entry.name}: {outcome}")
    kinds = ("typed", "typed-unnamed", "untyped", "accepted")
    print(f"{'family':14s} " + " ".join(f"{k:>14s}" for k in kinds))
    for family, counts in totals.items():
        print(f"{family:14s} " + " ".join(f"{counts[k]:14d}" for k in kinds))
    overall = sum(totals.values(), Counter())
    print(f"{'all':14s} " + " ".join(f"{overall[k]:14d}" for k in kinds) + f"   ({len(CATALOGUE)} entries)")


if __name__ == "__main__":
    main()
