"""Inputs for the custom-op tests: per public op, calls on conformance-like shapes (the quick
conformance shapes, scaled down where opcheck's several passes would be slow).

Each case is a function of the seed that returns the public call's (args, kwargs); it is built
inside the backend's `use_backend` block, so prepared operands come in that backend's bytes.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import torch

import portable_kernels as pk
from portable_kernels.layouts import contiguous_m_indices, psum_layout
from portable_kernels.testing.generators import poison, randn
from portable_kernels.testing.mla_cases import QUICK_SHAPES as MLA_SHAPES
from portable_kernels.testing.mla_cases import build_paged_cache, random_indices, random_kv

Call = tuple[tuple, dict]

#: backend name, use_backend options; nvidia runs in emulation on CPU tensors
BACKENDS = {"cpu": ("cpu", {}), "nvidia-sm90": ("nvidia", {"arch": "sm90"}),
            "nvidia-sm100": ("nvidia", {"arch": "sm100"}), "ascend-950": ("ascend", {"soc": "950"}),
            "ascend-910b": ("ascend", {"soc": "910b"})}


#: ops whose call depends on the backend beyond its provider: quantized operands or outputs in the
#: backend's Format, the grouped-GEMM alignment, the MLA metadata's backend. Every op is checked on
#: cpu and on nvidia (both archs); the Ascend variants add only these (the others run the same
#: boundary code on every backend; CI time).
BACKEND_DEPENDENT = {"fp8_gemm_nt", "fp8_fp4_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous",
                     "m_grouped_fp8_gemm_nt_masked", "m_grouped_bf16_gemm_nt_contiguous", "per_token_cast_to_fp8",
                     "per_block_cast_to_fp8", "per_token_cast_to_fp4", "swiglu_forward_and_per_token_cast",
                     "get_fused_mapping", "get_mla_metadata", "flash_mla_with_kvcache"}


@attrs.frozen
class OpCase:
    op: str
    label: str
    build: Callable[[int], Call]

    @property
    def id(self) -> str:
        return f"{self.op}[{self.label}]"


CASES: list[OpCase] = []


def matrix() -> list[tuple[OpCase, str]]:
    """(case, backend) pairs to check: every case on cpu and nvidia, backend-dependent ones on every backend."""
    return [(c, backend) for c in CASES for backend in BACKENDS
            if not backend.startswith("ascend") or c.op in BACKEND_DEPENDENT]


def case(op: str, label: str) -> Callable[[Callable[[int], Call]], Callable[[int], Call]]:
    def add(build: Callable[[int], Call]) -> Callable[[int], Call]:
        CASES.append(OpCase(op, label, build))
        return build
    return add


def _prepared(op: str, **operands: Any) -> dict[str, Any]:
    return pk.prepare_inputs(op, **operands)


# -- GEMMs --------------------------------------------------------------------------------------

def _fp8_gemm(m: int, n: int, k: int, form: str, out_dtype: torch.dtype, with_c: bool) -> Callable[[int], Call]:
    def build(seed: int) -> Call:
        x = randn(m, k, seed=seed, dtype=torch.bfloat16)
        w = randn(n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
        a, b = pk.per_token_cast_to_fp8(x, use_ue8m0=True), pk.per_block_cast_to_fp8(w, use_ue8m0=True)
        if form == "prepared":
            a, b = _prepared("fp8_gemm_nt", a=a, b=b).values()
        elif form == "raw":
            a, b = tuple(a), tuple(b)
        c = randn(m, n, seed=seed + 2) if with_c else None
        return (a, b, poison(m, n, dtype=out_dtype), c), {}
    return build


for _m, _n, _k in ((1, 128, 128), (3, 130, 300), (17, 1, 7)):
    case("fp8_gemm_nt", f"prepared {_m}x{_n}x{_k}")(_fp8_gemm(_m, _n, _k, "prepared", torch.bfloat16, False))
case("fp8_gemm_nt", "QuantTensor, fp32 d, c")(_fp8_gemm(3, 130, 300, "quant", torch.float32, True))
case("fp8_gemm_nt", "raw tuples")(_fp8_gemm(4, 64, 256, "raw", torch.bfloat16, False))


@case("bf16_gemm_nt", "3x130x300 c")
def _bf16_gemm(seed: int) -> Call:
    a, b = randn(3, 300, seed=seed, dtype=torch.bfloat16), randn(130, 300, seed=seed + 1, dtype=torch.bfloat16)
    return (a, b, poison(3, 130, dtype=torch.float32), randn(3, 130, seed=seed + 2)), {}


@case("tf32_hc_prenorm_gemm", "13x24x700, 3 splits")
def _hc_prenorm(seed: int) -> Call:
    a, b = randn(13, 700, seed=seed, dtype=torch.bfloat16), randn(24, 700, seed=seed + 1)
    return (a, b, poison(3, 13, 24, dtype=torch.float32), poison(3, 13, dtype=torch.float32), 3), {}


@case("fp8_fp4_gemm_nt", "prepared 7x130x320")
def _fp8_fp4_gemm(seed: int) -> Call:
    x, w = randn(7, 320, seed=seed, dtype=torch.bfloat16), randn(130, 320, seed=seed + 1, dtype=torch.bfloat16)
    a = pk.per_token_cast_to_fp8(x, use_ue8m0=True)
    b = pk.per_token_cast_to_fp4(w, gran_k=32, use_ue8m0=True)
    p = _prepared("fp8_fp4_gemm_nt", a=a, b=b)
    return (p["a"], p["b"], poison(7, 130, dtype=torch.bfloat16)), {}


def _counts(groups: int, alignment: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2 * alignment, (groups,), generator=torch.Generator().manual_seed(seed))


def _grouped(fp8: bool, psum: bool) -> Callable[[int], Call]:
    def build(seed: int) -> Call:
        groups, n, k = 3, 64, 256
        alignment = pk.get_m_alignment_for_contiguous_layout()
        counts = _counts(groups, alignment, seed)
        m_indices = contiguous_m_indices(counts, alignment)
        m = m_indices.numel()
        x = randn(m, k, seed=seed, dtype=torch.bfloat16) * (m_indices >= 0)[:, None]
        w = randn(groups, n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
        layout = psum_layout(counts, alignment) if psum else m_indices
        kwargs = {"use_psum_layout": psum}
        d = poison(m, n, dtype=torch.bfloat16)
        if not fp8:
            return (x, w, d, layout), kwargs
        p = _prepared("m_grouped_fp8_gemm_nt_contiguous", a=pk.per_token_cast_to_fp8(x, use_ue8m0=True),
                      b=pk.per_block_cast_to_fp8(w, use_ue8m0=True))
        return (p["a"], p["b"], d, layout), kwargs
    return build


def _masked(fp8: bool) -> Callable[[int], Call]:
    def build(seed: int) -> Call:
        groups, max_m, n, k = 3, 40, 64, 256
        x = randn(groups, max_m, k, seed=seed, dtype=torch.bfloat16)
        w = randn(groups, n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
        masked_m = torch.tensor([3, 0, 40], dtype=torch.int32)
        d = poison(groups, max_m, n, dtype=torch.bfloat16)
        if not fp8:
            return (x, w, d, masked_m, 16), {}
        p = _prepared("m_grouped_fp8_gemm_nt_masked", a=pk.per_token_cast_to_fp8(x, use_ue8m0=True),
                      b=pk.per_block_cast_to_fp8(w, use_ue8m0=True))
        return (p["a"], p["b"], d, masked_m, 16), {}
    return build


case("m_grouped_fp8_gemm_nt_contiguous", "m_indices")(_grouped(True, False))
case("m_grouped_fp8_gemm_nt_contiguous", "psum")(_grouped(True, True))
case("m_grouped_bf16_gemm_nt_contiguous", "m_indices")(_grouped(False, False))
case("m_grouped_bf16_gemm_nt_contiguous", "psum")(_grouped(False, True))
case("m_grouped_fp8_gemm_nt_masked", "3x40x64x256")(_masked(True))
case("m_grouped_bf16_gemm_nt_masked", "3x40x64x256")(_masked(False))


# -- quantizers -----------------------------------------------------------------------------------

def _cast(op: str, shape: tuple[int, ...], consumer: str | None, **kwargs: Any) -> Callable[[int], Call]:
    def build(seed: int) -> Call:
        x = randn(*shape, seed=seed, dtype=torch.bfloat16)
        extra = dict(kwargs)
        if consumer is not None:
            extra["prepare_for"] = consumer
        return (x,), extra
    return build


case("per_token_cast_to_fp8", "3x300")(_cast("per_token_cast_to_fp8", (3, 300), None))
case("per_token_cast_to_fp8", "2x5x256 ue8m0")(_cast("per_token_cast_to_fp8", (2, 5, 256), None, use_ue8m0=True))
case("per_token_cast_to_fp8", "3x300 for fp8_gemm_nt")(
    _cast("per_token_cast_to_fp8", (3, 300), "fp8_gemm_nt", use_ue8m0=True))
case("per_token_cast_to_fp8", "2x5x256 for masked")(
    _cast("per_token_cast_to_fp8", (2, 5, 256), "m_grouped_fp8_gemm_nt_masked", use_ue8m0=True))
case("per_block_cast_to_fp8", "130x300")(_cast("per_block_cast_to_fp8", (130, 300), None))
case("per_block_cast_to_fp8", "2x130x256 for contiguous b")(
    _cast("per_block_cast_to_fp8", (2, 130, 256), "m_grouped_fp8_gemm_nt_contiguous", use_ue8m0=True))
case("per_token_cast_to_fp4", "3x300")(_cast("per_token_cast_to_fp4", (3, 300), None))
case("per_token_cast_to_fp4", "64x256 for fp8_fp4_gemm_nt b")(
    _cast("per_token_cast_to_fp4", (64, 256), "fp8_fp4_gemm_nt", gran_k=32))


@case("swiglu_forward_and_per_token_cast", "16x256")
def _swiglu_plain(seed: int) -> Call:
    return (randn(16, 256, seed=seed, dtype=torch.bfloat16),), {}


@case("swiglu_forward_and_per_token_cast", "33x128 weighted, padded, clamped, for fp8_gemm_nt")
def _swiglu_mapped(seed: int) -> Call:
    rows, tokens, k = 33, 12, 3
    pos_to_token_topk = torch.randint(-1, tokens * k, (rows,), generator=torch.Generator().manual_seed(seed),
                                      dtype=torch.int32)
    weights = torch.rand(tokens, k, generator=torch.Generator().manual_seed(seed + 1))
    pos_to_expert = torch.where(pos_to_token_topk >= 0, 0, -1).to(torch.int32)
    x = randn(rows, 128, seed=seed + 2, dtype=torch.bfloat16)
    kwargs = {"pos_to_token_topk": pos_to_token_topk, "topk_weights": weights, "pos_to_expert": pos_to_expert,
              "round_sf": True, "swiglu_clamp_value": 0.5, "clamped_count": torch.zeros(3, dtype=torch.int64),
              "prepare_for": "fp8_gemm_nt"}
    return (x,), kwargs


@case("swiglu_forward", "16x256")
def _swiglu_forward(seed: int) -> Call:
    return (randn(16, 256, seed=seed, dtype=torch.bfloat16),), {}


@case("swiglu_forward", "33x128 weighted, padded, clamped")
def _swiglu_forward_mapped(seed: int) -> Call:
    (x,), kwargs = _swiglu_mapped(seed)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("round_sf", "prepare_for")}
    return (x,), kwargs


@case("block_cast", "3x300 e4m3 per (1, 128)")
def _block_cast_fp8(seed: int) -> Call:
    return (randn(3, 300, seed=seed, dtype=torch.bfloat16), "e4m3", (1, 128)), {}


@case("block_cast", "130x256 e2m1 per (128, 32), round_sf")
def _block_cast_fp4(seed: int) -> Call:
    return (randn(130, 256, seed=seed), "e2m1", (128, 32), True), {}


@case("block_cast", "5x64 e4m3 per (1, 32) with given scales")
def _block_cast_sf(seed: int) -> Call:
    sf = torch.rand(5, 2, generator=torch.Generator().manual_seed(seed)) + 0.01
    return (randn(5, 64, seed=seed + 1), "e4m3", (1, 32)), {"sf": sf}


@case("per_token_cast_to_e5m6", "6x72 per (1, 32), round_sf")
def _e5m6_cast(seed: int) -> Call:
    return (randn(6, 72, seed=seed, dtype=torch.bfloat16), 32, True), {}


@case("per_token_cast_to_e5m6", "3x256 per row")
def _e5m6_cast_row(seed: int) -> Call:
    return (randn(3, 256, seed=seed), 256), {}


# -- top-k and routing --------------------------------------------------------------------------

@case("topk", "4x1000 k=8 sorted")
def _topk_sorted(seed: int) -> Call:
    return (randn(4, 1000, seed=seed), 8), {"sorted": True}


@case("topk", "3x300 k=32 end, int32, no values")
def _topk_end(seed: int) -> Call:
    end = torch.tensor([300, 5, 0], dtype=torch.int32)
    return (randn(3, 300, seed=seed, dtype=torch.bfloat16), 32), {"end": end, "indices_type": torch.int32,
                                                                  "return_value": False}


@case("top2_sum_gate", "7 tokens, 32 experts in 8 groups, top 6 of 4 groups")
def _gate(seed: int) -> Call:
    logits, bias = randn(7, 32, seed=seed), randn(32, seed=seed + 1, scale=0.1)
    mask = torch.tensor([True, True, False, True, True, True, False])
    return (logits, bias, 6, 4, 8), {"routed_scaling_factor": 2.5, "mask": mask}


@case("top2_sum_gate", "16 tokens, 8 experts in 4 groups, top 2 of 2 groups, no mask")
def _gate_unmasked(seed: int) -> Call:
    return (randn(16, 8, seed=seed), randn(8, seed=seed + 1, scale=0.1), 2, 2, 4), {}


@case("top2_sum_gate", "fixed routing, a shared expert, physical replicas, TP masking")
def _gate_routed(seed: int) -> Call:
    t, e, k = 7, 16, 3
    g = torch.Generator().manual_seed(seed)
    # row l: logical expert l (the shared expert is row 16), then two extra physical experts 16 and 17
    to_physical_map = torch.tensor([[min(i, 16), 16, 17] for i in range(e + 1)], dtype=torch.int32)
    logical_count = torch.randint(1, 4, (e + 1,), generator=g, dtype=torch.int32)
    unmapped = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    fix = torch.rand(t, generator=g) < 0.5
    kwargs = {"use_shared_as_routed": True, "num_shared_experts": 1, "ep_rank": 1, "num_ep_ranks": 2,
              "tp_rank": 0, "num_tp_ranks": 2, "fix_routing_mask": fix, "to_physical_map": to_physical_map,
              "logical_count": logical_count, "unmapped_topk_idx": unmapped}
    return (randn(t, e, seed=seed), None, k, 2, 4), kwargs


@case("topk_gate", "7x32 top 6")
def _topk_gate(seed: int) -> Call:
    return (randn(7, 32, seed=seed), 6), {}


@case("topk_sum_and_topk_group_idx", "7 tokens, 8 groups of 4, top-2 sums, 3 groups")
def _group_idx(seed: int) -> Call:
    return (randn(7, 8, 4, seed=seed), 2, 3), {}


@case("mask_indices_by_tp", "7x3 of 16 experts on 4 EP ranks, TP rank 1 of 2")
def _mask_by_tp(seed: int) -> Call:
    return (_routing(7, 3, 16, seed), 16, 4, 1, 2), {}


@case("inplace_unique_group_indices", "7x4 group ids with repeats")
def _unique_groups(seed: int) -> Call:
    ids = torch.randint(-1, 4, (7, 4), generator=torch.Generator().manual_seed(seed))
    return (ids, 4), {}


@case("map_to_physical_experts", "7x3 of 8 logical experts, 2 replicas")
def _physical(seed: int) -> Call:
    g = torch.Generator().manual_seed(seed)
    to_physical_map = torch.randperm(16, generator=g).view(8, 2).to(torch.int32)
    logical_count = torch.randint(1, 3, (8,), generator=g, dtype=torch.int32)
    return (_routing(7, 3, 8, seed), to_physical_map, logical_count, 1), {}


@case("group_count", "7x3 of 8 groups")
def _group_count(seed: int) -> Call:
    return (_routing(7, 3, 8, seed), 8), {}


@case("aux_fi", "7x3 of 8 experts")
def _aux_fi(seed: int) -> Call:
    return (_routing(7, 3, 8, seed), 8, 3), {}


@case("normalize_weight", "7x6")
def _normalize(seed: int) -> Call:
    return (torch.rand(7, 6, generator=torch.Generator().manual_seed(seed)),), {}


def _routing(tokens: int, k: int, experts: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    drop = torch.rand(tokens, k, generator=g) < 0.2
    return idx.masked_fill(drop, -1)


@case("get_fused_mapping", "7x3 of 8 experts, sized exactly")
def _mapping_exact(seed: int) -> Call:
    return (_routing(7, 3, 8, seed), 8), {}


@case("get_fused_mapping", "7x3 of 8 experts, no sync")
def _mapping_bound(seed: int) -> Call:
    return (_routing(7, 3, 8, seed), 8), {"force_no_sync": True, "alignment": 4}


@case("get_fused_mapping", "7x3 of 8 experts, 64 rows")
def _mapping_rows(seed: int) -> Call:
    return (_routing(7, 3, 8, seed), 8, 64), {"alignment": 4}


def _mapping(seed: int, alignment: int = 4) -> pk.FusedMapping:
    return pk.get_fused_mapping(_routing(7, 3, 8, seed), 8, alignment=alignment)


@case("expand_to_fused", "7x64 bf16")
def _expand(seed: int) -> Call:
    return (randn(7, 64, seed=seed, dtype=torch.bfloat16), _mapping(seed)), {}


@case("expand_to_fused_with_sf", "7x256 fp8, col-major scales")
def _expand_sf(seed: int) -> Call:
    x = pk.per_token_cast_to_fp8(randn(7, 256, seed=seed, dtype=torch.bfloat16))
    return (x, 128, _mapping(seed)), {"use_tma_aligned_col_major_sf": True}


@case("expand_to_fused_with_sf", "7x256 raw pair")
def _expand_sf_raw(seed: int) -> Call:
    x = pk.per_token_cast_to_fp8(randn(7, 256, seed=seed, dtype=torch.bfloat16))
    mapping = _mapping(seed)
    return (tuple(x), 128, mapping.token_topk_to_pos, mapping.pos_to_expert), {}


@case("reduce_fused", "weighted bf16")
def _reduce(seed: int) -> Call:
    mapping = _mapping(seed)
    rows = mapping.pos_to_expert.numel()
    weights = torch.rand(7, 3, generator=torch.Generator().manual_seed(seed))
    return (randn(rows, 64, seed=seed + 1, dtype=torch.bfloat16), weights, mapping), {}


@case("reduce_fused", "scaled rows to fp8, into out")
def _reduce_fp8(seed: int) -> Call:
    mapping = _mapping(seed)
    rows = mapping.pos_to_expert.numel()
    x = (randn(rows, 64, seed=seed + 1), torch.rand(rows, generator=torch.Generator().manual_seed(seed)))
    out = torch.empty(7, 64, dtype=torch.float8_e4m3fn)
    return (x, None, mapping), {"fp8_format": "e4m3", "sf": torch.tensor([0.5]), "out": out}


# -- MLA ----------------------------------------------------------------------------------------

@case("get_mla_metadata", "3 sequences, s_q 2, h_q 16")
def _mla_metadata(seed: int) -> Call:
    return (torch.tensor([70, 0, 130], dtype=torch.int32), 32, 1), {"num_heads_q": 16}


def _decode(shape_index: int, with_out: bool) -> Callable[[int], Call]:
    shape = MLA_SHAPES[shape_index]

    def build(seed: int) -> Call:
        paged = build_paged_cache(random_kv(shape.lengths, shape.h_kv, shape.d, seed=seed), shape.block_size,
                                  seed=seed, fp8=shape.fp8)
        indices = random_indices(paged, shape.s_q, shape.topk, seed=seed + 1)[0] if shape.topk else None
        b = len(shape.lengths)
        q = randn(b, shape.s_q, shape.h_q, shape.d, seed=seed + 2, dtype=torch.bfloat16)
        meta, num_splits = pk.get_mla_metadata(paged.cache_seqlens, shape.s_q * shape.h_q // shape.h_kv, shape.h_kv,
                                               shape.h_q, shape.fp8, shape.topk)
        kwargs: dict[str, Any] = {"softmax_scale": shape.softmax_scale, "causal": shape.causal,
                                  "is_fp8_kvcache": shape.fp8, "indices": indices}
        if with_out:
            kwargs["out"] = poison(b, shape.s_q, shape.h_q, 512, dtype=torch.bfloat16)
            kwargs["lse"] = poison(b, shape.h_q, shape.s_q, dtype=torch.float32)
        return (q, paged.k_cache, paged.block_table, paged.cache_seqlens, 512, meta, num_splits), kwargs
    return build


for _i, _with_out in ((0, False), (1, True), (3, False), (4, True), (6, False)):  # 6: MODEL1 pages
    case("flash_mla_with_kvcache", MLA_SHAPES[_i].label() + (" into out/lse" if _with_out else ""))(
        _decode(_i, _with_out))


# -- EP -----------------------------------------------------------------------------------------

@case("get_dispatch_layout", "7 tokens x3, 12 experts on 3 ranks")
def _dispatch_layout(seed: int) -> Call:
    return (_routing(7, 3, 12, seed), 12, 3), {}


# -- drop-in parity (issue 11): new ops and keywords ----------------------------------------------

def _stored_pair(q: pk.QuantTensor) -> tuple:
    return q.data.T.contiguous(), q.scale.T.contiguous()


def _fp8_transposed(layout: str) -> Callable[[int], Call]:
    def build(seed: int) -> Call:
        x = randn(3, 256, seed=seed, dtype=torch.bfloat16)
        w = randn(70, 256, seed=seed + 1, dtype=torch.bfloat16, scale=256 ** -0.5)
        a, b = pk.per_token_cast_to_fp8(x, use_ue8m0=True), pk.per_block_cast_to_fp8(w, use_ue8m0=True)
        a = _stored_pair(a) if layout[0] == "t" else tuple(a)
        b = _stored_pair(b) if layout[1] == "n" else tuple(b)
        return (a, b, poison(3, 70, dtype=torch.bfloat16), randn(3, 70, seed=seed + 2)), {}
    return build


def _bf16_transposed(layout: str) -> Callable[[int], Call]:
    def build(seed: int) -> Call:
        a, b = randn(3, 96, seed=seed, dtype=torch.bfloat16), randn(70, 96, seed=seed + 1, dtype=torch.bfloat16)
        a = a.T.contiguous() if layout[0] == "t" else a
        b = b.T.contiguous() if layout[1] == "n" else b
        return (a, b, poison(3, 70, dtype=torch.float32)), {}
    return build


for _layout in ("nn", "tn", "tt"):
    case(f"fp8_gemm_{_layout}", "raw pairs as stored, c")(_fp8_transposed(_layout))
    case(f"bf16_gemm_{_layout}", "3x70x96")(_bf16_transposed(_layout))


@case("per_channel_cast_to_fp8", "300x64 deep_gemm convention")
def _per_channel(seed: int) -> Call:
    return (randn(300, 64, seed=seed, dtype=torch.bfloat16),), {"convention": "deep_gemm"}


case("per_token_cast_to_fp4", "3x300 deep_gemm convention")(
    _cast("per_token_cast_to_fp4", (3, 300), None, convention="deep_gemm"))


@case("m_grouped_fp8_gemm_nt_contiguous", "padding kept (ensure_zero_padding=False)")
def _grouped_keep(seed: int) -> Call:
    args, kwargs = _grouped(True, False)(seed)
    return args, {**kwargs, "ensure_zero_padding": False}


def _grouped_fp4(masked: bool) -> Callable[[int], Call]:
    def build(seed: int) -> Call:
        groups, n, k = 2, 32, 128
        w = randn(groups, n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
        b = pk.per_token_cast_to_fp4(w, gran_k=32, use_ue8m0=True)
        if masked:
            a = pk.per_token_cast_to_fp8(randn(groups, 8, k, seed=seed, dtype=torch.bfloat16), use_ue8m0=True)
            p = _prepared("m_grouped_fp8_fp4_gemm_nt_masked", a=a, b=b)
            return (p["a"], p["b"], poison(groups, 8, n, dtype=torch.bfloat16),
                    torch.tensor([5, 8], dtype=torch.int32), 6), {}
        alignment = pk.get_m_alignment_for_contiguous_layout()
        m_indices = contiguous_m_indices(torch.tensor([3, alignment]), alignment)
        a = pk.per_token_cast_to_fp8(randn(m_indices.numel(), k, seed=seed, dtype=torch.bfloat16), use_ue8m0=True)
        p = _prepared("m_grouped_fp8_fp4_gemm_nt_contiguous", a=a, b=b)
        return (p["a"], p["b"], poison(m_indices.numel(), n, dtype=torch.bfloat16), m_indices), {}
    return build


case("m_grouped_fp8_fp4_gemm_nt_contiguous", "m_indices, 2 groups")(_grouped_fp4(False))
case("m_grouped_fp8_fp4_gemm_nt_masked", "2x8x32x128")(_grouped_fp4(True))


def _k_grouped(kind: str) -> Callable[[int], Call]:
    def build(seed: int) -> Call:
        ks, m, n = [128, 256], 16, 24
        x, y = randn(384, m, seed=seed, dtype=torch.bfloat16), randn(384, n, seed=seed + 1, dtype=torch.bfloat16)
        layout, c = torch.tensor(ks, dtype=torch.int32), randn(2, m, n, seed=seed + 2)
        d = poison(2, m, n, dtype=torch.float32)
        if kind == "bf16":
            return (x, y, d, ks, layout, c), {}
        qx = [pk.per_channel_cast_to_fp8(x[s:s + k]) for s, k in ((0, 128), (128, 256))]
        qy = [pk.per_channel_cast_to_fp8(y[s:s + k]) for s, k in ((0, 128), (128, 256))]
        a = (torch.cat([q.data for q in qx]), torch.cat([q.scale for q in qx]))
        b = (torch.cat([q.data for q in qy]), torch.cat([q.scale for q in qy]))
        if kind == "nt":
            a = (torch.cat([q.data.T.contiguous().flatten() for q in qx]), a[1].T)
            b = (torch.cat([q.data.T.contiguous().flatten() for q in qy]), b[1].T)
        return (a, b, d, ks, layout, c), {}
    return build


case("k_grouped_fp8_gemm_tn_contiguous", "2 groups, K 128 + 256")(_k_grouped("tn"))
case("k_grouped_fp8_gemm_nt_contiguous", "2 groups, K 128 + 256")(_k_grouped("nt"))
case("k_grouped_bf16_gemm_tn_contiguous", "2 groups, K 128 + 256")(_k_grouped("bf16"))


@case("flash_mla_with_kvcache", "sparse with attn_sink, topk_length and an extra cache")
def _decode_extras(seed: int) -> Call:
    first = build_paged_cache(random_kv((40, 9), 1, 576, seed=seed), 16, seed=seed, fp8=True)
    extra = build_paged_cache(random_kv((5, 20), 1, 576, seed=seed + 1), 8, seed=seed + 1, fp8=True)
    idx = random_indices(first, 1, 16, seed=seed + 2)[0]
    extra_idx = random_indices(extra, 1, 4, seed=seed + 3)[0]
    meta, splits = pk.get_mla_metadata(first.cache_seqlens, 16, 1, 16, True, 16)
    q = randn(2, 1, 16, 576, seed=seed + 4, dtype=torch.bfloat16)
    return (q, first.k_cache, None, None, 512, meta, splits, None, False, True, idx, randn(16, seed=seed + 5),
            extra.k_cache, extra_idx, torch.tensor([16, 3], dtype=torch.int32), None), {}


@case("topk", "4x300 k=8, NaN row marked, offsets, into output_idx, no values")
def _topk_deepselect(seed: int) -> Call:
    x = randn(4, 300, seed=seed)
    x[2, 17] = float("nan")  # (no values: a marked row's values are NaN, which the comparison cannot match)
    return (x, 8), {"output_idx": torch.empty(4, 8, dtype=torch.int64), "return_value": False,
                    "output_idx_offset": torch.arange(4, dtype=torch.int32) * 300, "abort_when_nan_found": False}


@case("flash_mla_sparse_fwd", "5x16 heads, topk 16, sink, topk_length")
def _sparse_prefill(seed: int) -> Call:
    q, kv = randn(5, 16, 576, seed=seed, dtype=torch.bfloat16), randn(40, 1, 576, seed=seed + 1, dtype=torch.bfloat16)
    indices = torch.randint(-1, 44, (5, 1, 16), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    return (q, kv, indices, 576 ** -0.5, 512, randn(16, seed=seed + 2),
            torch.tensor([16, 3, 0, 8, 16], dtype=torch.int32)), {}


@case("flash_attn_varlen_func", "2 sequences, GQA 8/2, causal")
def _varlen(seed: int) -> Call:
    q, k = randn(14, 8, 64, seed=seed, dtype=torch.bfloat16), randn(21, 2, 64, seed=seed + 1, dtype=torch.bfloat16)
    v = randn(21, 2, 32, seed=seed + 2, dtype=torch.bfloat16)
    cu_q, cu_k = torch.tensor([0, 5, 14], dtype=torch.int32), torch.tensor([0, 12, 21], dtype=torch.int32)
    return (q, k, v, cu_q, cu_k, 9, 12), {"causal": True}


@case("fp8_mqa_logits", "6 queries x 40 keys, 8 heads, context-parallel ranges, bf16 logits")
def _mqa_logits(seed: int) -> Call:
    from portable_kernels.testing.indexer_cases import cp_ranges, quantized_queries
    q = quantized_queries(6, 8, 32, seed=seed)
    kv = pk.layouts.quantize_indexer_keys(randn(36, 32, seed=seed + 1))
    ks, ke = cp_ranges(6, 36, True)
    return ((q, None), kv, randn(6, 8, seed=seed + 2), ks, ke), {"logits_dtype": torch.bfloat16}


@case("fp8_paged_mqa_logits", "3 ragged sequences, next_n 2, shuffled blocks of 16")
def _paged_mqa_logits(seed: int) -> Call:
    from portable_kernels.testing.indexer_cases import build_indexer_cache, paged_context_lens, quantized_queries
    cache, table = build_indexer_cache((40, 3, 17), 16, 32, seed=seed)
    lens = paged_context_lens((40, 3, 17), 2)
    meta = pk.get_paged_mqa_logits_metadata(lens, 16, 4)
    return (quantized_queries(3, 2, 8, 32, seed=seed + 1), cache, randn(6, 8, seed=seed + 2), lens, table, meta,
            44), {"clean_logits": True}


@case("per_block_cast_lossless", "70x256 per (1, 32) -> (32, 32)")
def _lossless_cast(seed: int) -> Call:
    from portable_kernels.testing.lossless_cases import fp4_input
    data, sf = fp4_input(70, 256, (1, 32), seed)
    return (data, sf, (1, 32), (32, 32)), {}


@case("swiglu_backward_and_per_token_cast", "33x(2x128), 16x3 slots, n=32, round_sf, clamp 0.5")
def _swiglu_backward(seed: int) -> Call:
    from portable_kernels.testing.lossless_cases import swiglu_backward_inputs
    return (*swiglu_backward_inputs(33, 128, 16, 3, 32, seed), 32, True, 0.5), {}


# -- mHC (ops/mhc): M = 4 streams, small H; inputs fresh per seed --------------------------------------------

def _mhc_residual(seed: int, tokens: int = 5, h: int = 24) -> torch.Tensor:
    return randn(1, tokens, 4, h, seed=seed, dtype=torch.bfloat16)


@case("mhc_expand", "2x5x24 -> 4 streams")
def _mhc_expand(seed: int) -> Call:
    return (randn(2, 5, 24, seed=seed, dtype=torch.bfloat16), 4), {}


@case("mhc_expand_backward", "2x5x4x24")
def _mhc_expand_backward(seed: int) -> Call:
    return (randn(2, 5, 4, 24, seed=seed, dtype=torch.bfloat16),), {}


@case("mhc_sinkhorn", "2x5x4x4, 10 iterations")
def _mhc_sinkhorn(seed: int) -> Call:
    return (randn(2, 5, 4, 4, seed=seed), 10, 1e-6), {}


@case("mhc_sinkhorn_backward", "2x5x4x4, 10 iterations")
def _mhc_sinkhorn_backward(seed: int) -> Call:
    return (randn(2, 5, 4, 4, seed=seed), randn(2, 5, 4, 4, seed=seed + 1), 10, 1e-6), {}


@case("mhc_pre_split_mixes", "1x5x24, post x2")
def _mhc_pre_split_mixes(seed: int) -> Call:
    return (randn(1, 5, 24, seed=seed), randn(3, seed=seed + 1), randn(24, seed=seed + 2), 4, 2.0, 1e-2), {}


@case("mhc_pre_split_mixes_backward", "1x5x24, post x2")
def _mhc_pre_split_mixes_backward(seed: int) -> Call:
    return (randn(1, 5, 4, 1, seed=seed), randn(1, 5, 4, 1, seed=seed + 1), randn(1, 5, 4, 4, seed=seed + 2),
            randn(1, 5, 24, seed=seed + 3), randn(3, seed=seed + 4), randn(24, seed=seed + 5), 4, 2.0), {}


@case("mhc_head_compute_mix", "1x5x4")
def _mhc_head_compute_mix(seed: int) -> Call:
    return (randn(1, 5, 4, seed=seed), randn(1, seed=seed + 1), randn(4, seed=seed + 2), 1e-2), {}


@case("mhc_head_compute_mix_backward", "1x5x4")
def _mhc_head_compute_mix_backward(seed: int) -> Call:
    return (randn(1, 5, 4, seed=seed), randn(1, 5, 4, seed=seed + 1), randn(1, seed=seed + 2),
            randn(4, seed=seed + 3)), {}


@case("mhc_pre_apply_mix", "1x5x4x24")
def _mhc_pre_apply_mix(seed: int) -> Call:
    return (_mhc_residual(seed), randn(1, 5, 4, 1, seed=seed + 1)), {}


@case("mhc_pre_apply_mix_backward", "1x5x4x24")
def _mhc_pre_apply_mix_backward(seed: int) -> Call:
    return (randn(1, 5, 24, seed=seed, dtype=torch.bfloat16), _mhc_residual(seed + 1),
            randn(1, 5, 4, 1, seed=seed + 2)), {}


@case("mhc_post", "1x5x4x24")
def _mhc_post(seed: int) -> Call:
    return (randn(1, 5, 24, seed=seed, dtype=torch.bfloat16), _mhc_residual(seed + 1), randn(1, 5, 4, 1, seed=seed + 2),
            randn(1, 5, 4, 4, seed=seed + 3)), {}


@case("mhc_post_backward", "1x5x4x24")
def _mhc_post_backward(seed: int) -> Call:
    return (_mhc_residual(seed), randn(1, 5, 24, seed=seed + 1, dtype=torch.bfloat16), _mhc_residual(seed + 2),
            randn(1, 5, 4, 1, seed=seed + 3), randn(1, 5, 4, 4, seed=seed + 4)), {}


@case("mhc_pre_norm_fn", "1x5x4x24, 24 mixes")
def _mhc_pre_norm_fn(seed: int) -> Call:
    return (_mhc_residual(seed), randn(24, 96, seed=seed + 1) * 0.05, 1e-6), {}


@case("mhc_pre_norm_fn_backward", "1x5x4x24, 24 mixes")
def _mhc_pre_norm_fn_backward(seed: int) -> Call:
    return (randn(1, 5, 24, seed=seed), _mhc_residual(seed + 1), randn(24, 96, seed=seed + 2) * 0.05, 1e-6), {}
