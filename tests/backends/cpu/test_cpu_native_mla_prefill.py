"""The cpu backend's native sparse MLA prefill (backends/cpu/providers/mla_prefill.py on mla.cpp's
engines, pk_mla_sparse_prefill): out, max_logits and lse against the contract's fp64 reference from
the same bf16 operands (invalid indices, topk_length, attn_sink, 16/64/128 heads, d 576 and 512, a kv
view with a wider row stride, rows that see no key, jobs split several ways), the registry serving
it, typed errors naming the argument, and a kv whose channels are not adjacent declined by reason
(the reference runs it) rather than read wrongly."""

from __future__ import annotations

import math

import pytest
import torch

import portable_kernels as pk
from portable_kernels.backends.cpu.providers import mla as nm
from portable_kernels.backends.cpu.providers import mla_prefill as mp
from portable_kernels.core.dispatch import provider_for, trace_providers
from portable_kernels.core.errors import ContractError
from portable_kernels.ops.attention.decode import LSE_ABS_TOL, LSE_REL_TOL, OUT_ABS_TOL, OUT_REL_TOL, MlaDecodeInputs
from portable_kernels.ops.attention.prefill import FLASH_MLA_SPARSE_FWD, SparsePrefillInputs, sparse_prefill_reference
from portable_kernels.testing.checks import assert_close
from portable_kernels.testing.generators import generator, poison, randn
from portable_kernels.testing.mla_cases import assert_allclose

pytestmark = pytest.mark.skipif(not nm.available(), reason="native MLA needs the built library")

OP = "flash_mla_sparse_fwd"


@pytest.fixture(params=["fma", "amx"])
def engine(request):
    """Each engine this CPU runs: FMA everywhere, AMX where the CPU has AMX-BF16."""
    if request.param not in nm.engines():
        pytest.skip(f"the {request.param} engine does not run on this CPU (engines here: {nm.engines()})")
    return request.param


def _operands(s_q, h_q, d, s_kv, topk, *, sink, lengths, seed, row_pad=0):
    """q, kv (a view of rows d + row_pad apart when row_pad), indices with -1 and >= s_kv entries and
    query 0 seeing no key, sink (one +inf head) or None, lengths (0 and topk among them) or None. kv
    rows no index selects are NaN: a kernel that reads them fails."""
    g = generator(seed)
    q = randn(s_q, h_q, d, seed=seed, dtype=torch.bfloat16)
    wide = randn(s_kv, 1, d + row_pad, seed=seed + 1, dtype=torch.bfloat16)
    idx = torch.randint(-1, s_kv + 4, (s_q, 1, topk), generator=g, dtype=torch.int32)
    idx[0] = -1
    if s_q > 1:
        idx[1, 0, : topk // 2] = torch.tensor([s_kv, -1, 2 ** 31 - 1, -7] * topk, dtype=torch.int32)[: topk // 2]
    chosen = torch.zeros(s_kv, dtype=torch.bool)
    chosen[idx[(idx >= 0) & (idx < s_kv)].long()] = True
    wide[~chosen] = float("nan")
    kv = wide[:, :, :d] if row_pad else wide
    attn_sink = None
    if sink:
        attn_sink = (torch.randn(h_q, generator=g) * 2).float()
        attn_sink[-1] = float("inf")
    topk_length = None
    if lengths:
        topk_length = torch.randint(0, topk + 1, (s_q,), generator=g, dtype=torch.int32)
        topk_length[-1] = 0
        if s_q > 2:
            topk_length[1] = topk  # the half-invalid row reads all its indices
    return q, kv, idx, attn_sink, topk_length


def _native(q, kv, idx, attn_sink, topk_length, engine=None, scale=None):
    s_q, h_q, d = q.shape
    out = poison(s_q, h_q, 512, dtype=torch.bfloat16)
    max_logits, lse = poison(s_q, h_q, dtype=torch.float32), poison(s_q, h_q, dtype=torch.float32)
    call = SparsePrefillInputs(q, kv, idx, d ** -0.5 if scale is None else scale, 512, attn_sink, topk_length, out,
                               max_logits, lse)
    mp.sparse_prefill_native(call, engine)
    return out, max_logits, lse


def _check(got, q, kv, idx, attn_sink, topk_length, scale=None):
    out, max_logits, lse = got
    ref_out, ref_max, ref_lse = sparse_prefill_reference(q, kv, idx, q.shape[-1] ** -0.5 if scale is None else scale,
                                                         512, attn_sink, topk_length, dtype=torch.float64)
    assert_allclose(out, ref_out, OUT_ABS_TOL, OUT_REL_TOL, "out")
    assert_allclose(lse, ref_lse, LSE_ABS_TOL, LSE_REL_TOL, "lse")
    assert_allclose(max_logits, ref_max, LSE_ABS_TOL, LSE_REL_TOL, "max_logits")
    assert_close(out, ref_out, FLASH_MLA_SPARSE_FWD.tolerance.dequantized, "out vs fp64 reference")
    return ref_lse


def _assert_lonely(got, rows):
    out, max_logits, lse = got
    assert bool((out[rows] == 0).all())
    assert bool(torch.isposinf(lse[rows]).all()) and bool(torch.isneginf(max_logits[rows]).all())


@pytest.mark.parametrize("s_q,h_q,d,s_kv,topk,sink,lengths,row_pad", [
    (5, 16, 576, 40, 16, True, True, 0),
    (3, 16, 512, 7, 32, False, False, 0),
    (6, 64, 576, 300, 130, True, False, 64),     # a kv view: rows 640 channels apart
    (4, 128, 576, 200, 70, False, True, 0),      # 128 heads: row blocks leave a remainder
    (3, 64, 512, 100, 65, True, True, 8),
], ids=["h16-d576-sink-len", "h16-d512", "h64-view-sink", "h128-len", "h64-d512-view-sink-len"])
def test_matches_the_reference(s_q, h_q, d, s_kv, topk, sink, lengths, row_pad, engine):
    ops = _operands(s_q, h_q, d, s_kv, topk, sink=sink, lengths=lengths, seed=100 + s_q + h_q + d, row_pad=row_pad)
    if row_pad:
        assert ops[1].stride(0) == d + row_pad and not ops[1].is_contiguous()
    got = _native(*ops, engine=engine)
    ref_lse = _check(got, *ops)
    _assert_lonely(got, 0)  # query 0: every index is -1
    if lengths:
        _assert_lonely(got, s_q - 1)  # topk_length 0
    assert bool(torch.isfinite(ref_lse[1]).any())  # the half-invalid row still sees keys


def test_a_sink_scales_out_only_and_an_infinite_sink_zeroes_it(engine):
    q, kv, idx, sink, _ = _operands(4, 16, 576, 50, 24, sink=True, lengths=False, seed=7)
    with_sink = _native(q, kv, idx, sink, None, engine)
    without = _native(q, kv, idx, None, None, engine)
    _check(with_sink, q, kv, idx, sink, None)
    assert torch.equal(with_sink[2], without[2]) and torch.equal(with_sink[1], without[1])  # lse, max_logits
    assert bool((with_sink[0][:, -1] == 0).all())  # the +inf head
    ratio = with_sink[0][1:, 0].float().norm() / without[0][1:, 0].float().norm()
    assert float(ratio) < 1.0


def test_topk_length_outside_0_topk_is_clamped_by_the_kernel(engine):
    """The contract refuses such lengths when it checks values; the kernel clamps them anyway (a
    compiled graph skips the value check), reading no index past topk."""
    q, kv, idx, _, _ = _operands(4, 16, 576, 60, 32, sink=False, lengths=False, seed=8)
    lengths = torch.tensor([5, 10 ** 6, -3, 32], dtype=torch.int32)
    got = _native(q, kv, idx, None, lengths, engine)
    _check(got, q, kv, idx, None, lengths.clamp(0, 32))
    _assert_lonely(got, 2)
    with pytest.raises(ContractError, match="topk_length"):
        pk.flash_mla_sparse_fwd(q, kv, idx, 576 ** -0.5, 512, None, lengths)


def test_the_vectorised_plan_is_the_decode_plan():
    g = generator(9)
    for threads in (1, 2, 8, 64):
        keys = torch.randint(0, 3000, (11,), generator=g)
        keys[3] = 0
        want = nm.mla_split_plan(keys.tolist(), 1, threads)[0]
        assert torch.equal(mp.sparse_plan(keys, threads), want)
        uniform, nslots = mp.uniform_plan(5, 3000, threads)  # kept per shape: calls without topk_length
        assert torch.equal(uniform, nm.mla_split_plan([3000] * 5, 1, threads)[0])
        assert nslots == int((uniform[:, 3] >= 0).sum()) and (nslots > 0) == (threads > 2)


@pytest.mark.parametrize("topk,lengths", [(2048, False), (1500, True)])
def test_jobs_split_several_ways_merge_to_the_reference(topk, lengths, engine, monkeypatch):
    """Few query tokens and long index lists: with 8 threads the plan cuts every job into several
    splits (merged by their lse), and the answer is the one-split answer within the bounds."""
    ops = _operands(3, 16, 576, 4096, topk, sink=True, lengths=lengths, seed=10)
    keys = torch.full((3,), topk) if ops[4] is None else ops[4].long()
    plan = mp.sparse_plan(keys, 8)
    per_job = torch.bincount(plan[:, 0], minlength=3)
    assert int(per_job.max()) >= 3 and bool((plan[:, 3] >= 0).any())
    monkeypatch.setattr(mp, "num_threads", lambda: 8)
    many = _native(*ops, engine=engine)
    _check(many, *ops)
    monkeypatch.setattr(mp, "num_threads", lambda: 1)
    assert mp.sparse_plan(keys, 1).shape[0] < plan.shape[0]
    _check(_native(*ops, engine=engine), *ops)


def test_the_registry_serves_it_natively_and_fp16_runs_the_reference():
    q, kv, idx, sink, lengths = _operands(5, 16, 576, 40, 16, sink=True, lengths=True, seed=11)
    with trace_providers() as ran:
        got = pk.flash_mla_sparse_fwd(q, kv, idx, 576 ** -0.5, 512, sink, lengths)
    assert ran == [(OP, "cpu", "native")]
    _check(got, q, kv, idx, sink, lengths)
    with trace_providers() as ran:
        pk.flash_mla_sparse_fwd(q.half(), kv.half(), idx, 576 ** -0.5, 512, sink, lengths)
    assert ran == [(OP, "cpu", "reference")]


def test_a_kv_with_strided_channels_is_declined_by_reason_and_runs_the_reference():
    q, kv, idx, sink, lengths = _operands(4, 16, 576, 40, 16, sink=True, lengths=True, seed=12)
    strided = torch.full((40, 1, 576 * 2), float("nan"), dtype=torch.bfloat16)[..., ::2]
    strided.copy_(kv)
    assert strided.stride(-1) == 2
    with trace_providers() as ran:
        pk.flash_mla_sparse_fwd(q, kv, idx, 576 ** -0.5, 512, sink, lengths)   # same signature, native first
        got = pk.flash_mla_sparse_fwd(q, strided, idx, 576 ** -0.5, 512, sink, lengths)
    assert ran == [(OP, "cpu", "native"), (OP, "cpu", "reference")]
    _check(got, q, kv, idx, sink, lengths)
    call = SparsePrefillInputs(q, strided, idx, 0.05, 512, sink, lengths, poison(4, 16, 512, dtype=torch.bfloat16),
                               poison(4, 16, dtype=torch.float32), poison(4, 16, dtype=torch.float32))
    reasons = mp.problems(call)
    assert len(reasons) == 1 and "'kv'" in reasons[0] and "stride" in reasons[0]
    assert provider_for(FLASH_MLA_SPARSE_FWD, call).name == "reference"
    with pytest.raises(ContractError, match="kv"):  # called directly: refused before the C++ reads
        mp.sparse_prefill_native(call)
    assert bool(call.out.isnan().all())


def _direct(**changes):
    q, kv, idx, sink, lengths = _operands(3, 16, 576, 20, 8, sink=True, lengths=True, seed=13)
    fields = dict(q=q, kv=kv, indices=idx, sm_scale=0.05, d_v=512, attn_sink=sink, topk_length=lengths,
                  out=poison(3, 16, 512, dtype=torch.bfloat16), max_logits=poison(3, 16, dtype=torch.float32),
                  lse=poison(3, 16, dtype=torch.float32))
    fields.update(changes)
    return SparsePrefillInputs(**fields)


@pytest.mark.parametrize("arg,changes", [
    ("q", {"q": randn(3, 16, 576, seed=1, dtype=torch.float16)}),
    ("q", {"q": randn(3, 16, 320, seed=1, dtype=torch.bfloat16)}),
    ("kv", {"kv": randn(20, 1, 576, seed=1)}),
    ("kv", {"kv": randn(20, 2, 576, seed=1, dtype=torch.bfloat16)}),
    ("indices", {"indices": torch.zeros(3, 1, 8, dtype=torch.int64)}),
    ("indices", {"indices": torch.zeros(2, 1, 8, dtype=torch.int32)}),
    ("topk_length", {"topk_length": torch.zeros(4, dtype=torch.int32)}),
    ("attn_sink", {"attn_sink": torch.zeros(16, dtype=torch.bfloat16)}),
    ("d_v", {"d_v": 256}),
    ("out", {"out": poison(3, 16, 256, dtype=torch.bfloat16)}),
    ("lse", {"lse": poison(16, 3, dtype=torch.float32).T}),
])
def test_bad_direct_calls_are_refused_naming_the_argument(arg, changes):
    call = _direct(**changes)
    with pytest.raises(ContractError, match=f"'?{arg}'?"):
        mp.sparse_prefill_native(call)
    if "out" not in changes:
        assert bool(call.out.isnan().all())  # nothing was written


@pytest.mark.parametrize("arg,call", [
    ("kv", lambda q, kv, idx: pk.flash_mla_sparse_fwd(q, kv.float(), idx, 0.05)),
    ("kv", lambda q, kv, idx: pk.flash_mla_sparse_fwd(q, kv[:, :, :512], idx, 0.05)),
    ("indices", lambda q, kv, idx: pk.flash_mla_sparse_fwd(q, kv, idx.long(), 0.05)),
    ("q", lambda q, kv, idx: pk.flash_mla_sparse_fwd(q[..., :320], kv, idx, 0.05)),
])
def test_bad_public_calls_are_refused_naming_the_argument(arg, call):
    q, kv, idx, _, _ = _operands(3, 16, 576, 20, 8, sink=False, lengths=False, seed=14)
    with pytest.raises(ContractError, match=arg):
        call(q, kv, idx)


def test_no_query_tokens_and_an_empty_kv():
    q, kv, idx, _, _ = _operands(3, 16, 576, 20, 8, sink=False, lengths=False, seed=15)
    out, max_logits, lse = pk.flash_mla_sparse_fwd(q[:0], kv, idx[:0], 0.05)
    assert out.shape == (0, 16, 512) and lse.shape == (0, 16)
    got = _native(q, kv[:0], idx, None, None)  # every index points past an empty kv
    _assert_lonely(got, slice(None))
    assert math.isinf(float(got[2][0, 0]))


def test_an_engine_this_cpu_lacks_is_refused_by_name():
    missing = [name for name in nm.ENGINES if name not in nm.engines()] or ["vector"]
    q, kv, idx, _, _ = _operands(3, 16, 576, 20, 8, sink=False, lengths=False, seed=16)
    with pytest.raises(ValueError, match=f"engine='{missing[0]}'"):
        _native(q, kv, idx, None, None, engine=missing[0])


def test_the_prefill_is_the_sparse_decode_of_one_sequence(engine):
    """Same engine, same jobs: the bf16 kv viewed as a paged cache of 64-token blocks, the sparse
    decode of one sequence with these indices gives the same bytes (lse transposed)."""
    q, kv, idx, _, _ = _operands(6, 16, 576, 256, 100, sink=False, lengths=False, seed=17)
    kv = kv.nan_to_num(0.0)  # the decode reads a cache, not only the selected rows
    out_of_range = _native(q, kv, idx, None, None, engine)
    idx = torch.where((idx >= 0) & (idx < 256), idx, -1)  # the decode refuses indices past the cache
    out, _, lse = _native(q, kv, idx, None, None, engine)
    plan = nm.mla_split_plan([100] * 6, 6, threads=1)[0]
    meta = pk.MlaMetadata("cpu", 1, 6 * 16, 1, 16, False, 100, (plan,), None)
    dec_out, dec_lse = poison(1, 6, 16, 512, dtype=torch.bfloat16), poison(1, 16, 6, dtype=torch.float32)
    nm.decode_native(MlaDecodeInputs(q[None], kv.view(4, 64, 1, 576), None, None, 512, 576 ** -0.5, False, False,
                                     idx.view(1, 6, 100), meta, None, dec_out, dec_lse), engine)
    assert torch.equal(dec_out[0], out) and torch.equal(dec_lse[0].T, lse)
    assert torch.equal(out_of_range[0], out) and torch.equal(out_of_range[2], lse)  # >= s_kv is -1
