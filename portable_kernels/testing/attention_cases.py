"""Conformance cases for the prefill attention family: sparse MLA prefill (invalid and out-of-range
indices, NaN in kv rows nobody selects, attn_sink with a +inf head, topk_length, lonely queries)
and varlen attention (grouped heads, causal, empty sequences), against fp64 references with
FlashMLA's published elementwise bounds."""

from __future__ import annotations

import functools

import torch

from ..ops.attention.prefill import (FLASH_ATTN_VARLEN, FLASH_MLA_SPARSE_FWD, flash_attn_varlen_func, flash_mla_sparse_fwd,
                         sparse_prefill_reference, varlen_reference)
from ..ops.attention.decode import LSE_ABS_TOL, LSE_REL_TOL, OUT_ABS_TOL, OUT_REL_TOL
from .checks import assert_close
from .core import Case, conformance_cases
from .generators import generator, randn
from .mla_cases import assert_allclose

#: FlashMLA's dense-prefill bounds (tests/test_fmha_sm100.py)
VARLEN_OUT_ABS, VARLEN_OUT_REL, VARLEN_LSE_REL = 1e-3, 8.01 / 128, 2.01 / 65536


def _sparse_case(s_q: int, h_q: int, d: int, s_kv: int, topk: int, sink: bool, limit: bool, seed: int,
                 device: torch.device) -> float:
    g = generator(seed)
    q = randn(s_q, h_q, d, seed=seed, dtype=torch.bfloat16)
    kv = randn(s_kv + 3, 1, d, seed=seed + 1, dtype=torch.bfloat16)[:s_kv].clone()
    idx = torch.randint(-1, s_kv + 4, (s_q, 1, topk), generator=g, dtype=torch.int32)   # -1 and >= s_kv: no key
    idx[0] = -1                                                                           # one lonely query
    chosen = torch.zeros(s_kv, dtype=torch.bool)
    chosen[idx[(idx >= 0) & (idx < s_kv)].long()] = True
    kv[~chosen] = float("nan")                                                            # never read
    attn_sink = (torch.randn(h_q, generator=g) * 2).float() if sink else None
    if sink:
        attn_sink[-1] = float("inf")
    lengths = torch.randint(0, topk + 1, (s_q,), generator=g, dtype=torch.int32) if limit else None
    out, max_logits, lse = flash_mla_sparse_fwd(
        q.to(device), kv.to(device), idx.to(device), d ** -0.5, 512,
        None if attn_sink is None else attn_sink.to(device), None if lengths is None else lengths.to(device))
    ref_out, ref_max, ref_lse = sparse_prefill_reference(q, kv, idx, d ** -0.5, 512, attn_sink, lengths,
                                                         dtype=torch.float64)
    assert_allclose(out, ref_out, OUT_ABS_TOL, OUT_REL_TOL, "out")
    assert_allclose(lse, ref_lse, LSE_ABS_TOL, LSE_REL_TOL, "lse")
    assert_allclose(max_logits, ref_max, LSE_ABS_TOL, LSE_REL_TOL, "max_logits")
    return assert_close(out, ref_out, FLASH_MLA_SPARSE_FWD.tolerance.dequantized, "out vs fp64 reference")


def _varlen_case(lengths_q, lengths_k, h_q: int, h_kv: int, d: int, d_v: int, causal: bool, seed: int,
                 device: torch.device) -> float:
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(int(cu_q[-1]), h_q, d, seed=seed, dtype=torch.bfloat16, scale=0.5)
    k = randn(int(cu_k[-1]), h_kv, d, seed=seed + 1, dtype=torch.bfloat16, scale=0.5)
    v = randn(int(cu_k[-1]), h_kv, d_v, seed=seed + 2, dtype=torch.bfloat16)
    scale = (d + 100) ** -0.5
    out, lse = flash_attn_varlen_func(q.to(device), k.to(device), v.to(device), cu_q.to(device), cu_k.to(device),
                                      max(lengths_q), max(lengths_k), softmax_scale=scale, causal=causal)
    ref_out, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, scale, causal, dtype=torch.float64)
    assert_allclose(out, ref_out, VARLEN_OUT_ABS, VARLEN_OUT_REL, "out")
    assert_allclose(lse, ref_lse, LSE_ABS_TOL, VARLEN_LSE_REL, "lse")
    return assert_close(out, ref_out, FLASH_ATTN_VARLEN.tolerance.dequantized, "out vs fp64 reference")


@conformance_cases("flash_mla_sparse_fwd")
def sparse_prefill_cases(quick: bool) -> list[Case]:
    shapes = [(5, 16, 576, 40, 16, True, True), (3, 8, 512, 7, 32, False, False), (4, 16, 576, 100, 64, True, False)]
    if not quick:
        shapes.append((64, 128, 576, 4096, 2048, True, True))
    return [Case("flash_mla_sparse_fwd", f"s_q={s} h_q={h} d={d} s_kv={n} topk={t} attn_sink={sk} topk_length={lim}",
                 9000 + 10 * i, functools.partial(_sparse_case, s, h, d, n, t, sk, lim, 9000 + 10 * i))
            for i, (s, h, d, n, t, sk, lim) in enumerate(shapes)]


@conformance_cases("flash_attn_varlen_func")
def varlen_cases(quick: bool) -> list[Case]:
    shapes = [((5, 1, 9), (7, 1, 9), 4, 4, 128, 128), ((3, 0, 12), (20, 4, 12), 8, 2, 192, 128)]
    if not quick:
        shapes.append(((300, 1000), (700, 1000), 16, 4, 192, 128))
    cases = []
    for i, (lq, lk, h_q, h_kv, d, d_v) in enumerate(shapes):
        for causal in (False, True):
            seed = 9100 + 10 * i + causal
            cases.append(Case("flash_attn_varlen_func", f"s_q={list(lq)} s_k={list(lk)} h={h_q}/{h_kv} d={d}/{d_v} "
                                                        f"causal={causal}", seed,
                              functools.partial(_varlen_case, lq, lk, h_q, h_kv, d, d_v, causal, seed)))
    return cases
