"""The cpu backend's native EP row passes (backends/cpu/kernels/ep.cpp) against the torch
reference kernels of portable_kernels.ops.ep.rows, byte for byte: the dispatch's send side, its
received metadata, the combine's fp32 sum with biases; and the refusals of inconsistent counts."""

from __future__ import annotations

import pytest
import torch

from portable_kernels.backends.cpu.providers import ep_rows
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.core.errors import ContractError
from portable_kernels.ops.ep.rows import (COMBINE_ROWS, PACK_DISPATCH_ROWS, UNPACK_DISPATCH_META, CombineInputs,
                                          PackInputs, UnpackInputs, combine_reference, pack_reference, run_rows,
                                          unpack_reference)
from portable_kernels.ops.ep.wire import pack_rows
from portable_kernels.ops.ep.workspace import Workspace
from portable_kernels.testing.generators import generator, poison, randn

pytestmark = pytest.mark.skipif(ep_rows.LIB.get() is None, reason=f"native EP rows unavailable: {ep_rows.LIB.reason()}")


def _in_rank(num_tokens: int, num_ranks: int, seed: int) -> torch.Tensor:
    in_rank = torch.rand(num_tokens, num_ranks, generator=generator(seed)) < 0.6
    in_rank[-1] = False  # a token sent nowhere
    return in_rank


def _bits(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.uint8).clone()


def _assert_same_bytes(a, b, what: str) -> None:
    assert (a is None) == (b is None), what
    if a is not None:
        assert a.dtype == b.dtype and a.shape == b.shape, what
        assert torch.equal(_bits(a), _bits(b)), what


def _blocks(rows: torch.Tensor, counts: list[int], leave_out: int | None) -> tuple:
    out, start = [], 0
    for d, n in enumerate(counts):
        out.append(None if d == leave_out else rows[start:start + n])
        start += n
    return tuple(out)


@pytest.mark.parametrize("form", ["bf16", "fp8", "fp32"])
@pytest.mark.parametrize("meta", ["ids+weights+src", "ids32+src", "src", "none"])
@pytest.mark.parametrize("num_ranks,leave_out", [(1, None), (3, None), (3, 2), (8, 0)])
def test_pack_equals_the_reference(form, meta, num_ranks, leave_out):
    tokens, hidden, k = 37, 256, 4
    x = randn(tokens, hidden, seed=1)
    parts: list[torch.Tensor] = []
    if form == "bf16":
        x = x.bfloat16()
    elif form == "fp8":
        x = x.to(torch.float8_e4m3fn)
        parts.append(randn(tokens, hidden // 128, seed=2).abs())
    if meta.startswith("ids"):
        dtype = torch.int32 if meta.startswith("ids32") else torch.int64
        parts.append(torch.randint(-1, 64, (tokens, k), generator=generator(3)).to(dtype))
        if "weights" in meta:
            parts.append(randn(tokens, k, seed=4))
    with_src = meta != "none"
    in_rank = _in_rank(tokens, num_ranks, seed=5)
    dest_token = in_rank.T.nonzero(as_tuple=True)[1]
    counts = in_rank.sum(dim=0).tolist()
    row = x.element_size() * hidden
    meta_bytes = sum(p.element_size() * p.shape[1] for p in parts) + 4 * with_src
    out = {}
    for name, fn in (("native", ep_rows.pack_native), ("reference", pack_reference)):
        rows = poison(dest_token.numel(), row, dtype=torch.uint8)
        meta_out = poison(dest_token.numel(), meta_bytes, dtype=torch.uint8) if meta_bytes else None
        fn(PackInputs(x, tuple(parts), with_src, in_rank, dest_token, tuple(counts), _blocks(rows, counts, leave_out),
                      meta_out))
        out[name] = (rows, meta_out)
    assert torch.equal(out["native"][0], out["reference"][0])
    _assert_same_bytes(out["native"][1], out["reference"][1], "metadata rows")
    first = 0 if leave_out != 0 else counts[0]
    assert torch.equal(out["native"][0][first], x[dest_token[first]].contiguous().view(torch.uint8).view(-1))
    if leave_out is not None and counts[leave_out]:  # the block left out stays as it was
        start = sum(counts[:leave_out])
        assert bool((out["native"][0][start:start + counts[leave_out]] == 255).all())


def test_pack_refuses_a_layout_that_does_not_count_the_rows():
    x = randn(8, 128, seed=1).bfloat16()
    in_rank = _in_rank(8, 2, seed=2)
    dest_token = in_rank.T.nonzero(as_tuple=True)[1]
    counts = in_rank.sum(dim=0).tolist()
    other = in_rank.clone()
    other[0, 0], other[0, 1] = True, False  # token 0's destinations change: other column counts
    if other.sum(dim=0).tolist() == counts:
        other[0, 0], other[0, 1] = False, True
    rows = poison(dest_token.numel(), 256, dtype=torch.uint8)
    with pytest.raises(ContractError, match="is_token_in_rank"):
        ep_rows.pack_native(PackInputs(x, (), True, other, dest_token, tuple(counts), _blocks(rows, counts, None),
                                       poison(dest_token.numel(), 4, dtype=torch.uint8)))


@pytest.mark.parametrize("ids", [torch.int64, torch.int32, None])
@pytest.mark.parametrize("weights", [True, False])
@pytest.mark.parametrize("scales", [0, 3])
@pytest.mark.parametrize("pad", [0, 5])
def test_unpack_equals_the_reference(ids, weights, scales, pad):
    received, k, rank, per_rank = 29, 6, 1, 8
    parts = []
    if scales:
        parts.append(randn(received, scales, seed=1))
    if ids is not None:
        # ids of every rank's experts, and -1: the local ones are [8, 16)
        parts.append(torch.randint(-1, 32, (received, k), generator=generator(2)).to(ids))
        if weights:
            parts.append(randn(received, k, seed=3))
    parts.append(torch.randint(0, 1000, (received, 1), generator=generator(4), dtype=torch.int32))
    meta = pack_rows(parts)
    call = UnpackInputs(meta, scales, ids, k if ids is not None else 0, weights and ids is not None, True, rank,
                        per_rank, received + pad)
    got, want = ep_rows.unpack_native(call), unpack_reference(call)
    for name, a, b in zip(("scales", "ids", "weights", "counts", "src"), got, want):
        _assert_same_bytes(a, b, name)
    if ids is not None:
        local = got[1][:received]
        assert bool(((local == -1) | ((local >= 0) & (local < per_rank))).all())
        assert int(got[3].sum()) == int((local >= 0).sum())


def _combine_case(num_ranks: int, me: int, tokens: int, hidden: int, seed: int, specials: bool):
    in_rank = _in_rank(tokens, num_ranks, seed)
    splits = in_rank.sum(dim=0).tolist()
    sent_tokens = in_rank.T.nonzero(as_tuple=True)[1]
    # magnitudes 2^-20 .. 2^20: fp32 sums of a few rows round, so another order gives other bytes
    exponents = torch.randint(-20, 21, (sum(splits), hidden), generator=generator(seed + 2)).float()
    rows = (randn(sum(splits), hidden, seed=seed + 1) * torch.pow(2.0, exponents)).bfloat16()
    # and every third element +-2^24 or +-2^-3, whose sums cancel or not by the order alone
    cancelling = torch.where(torch.rand(rows.shape, generator=generator(seed + 3)) < 0.5, 2.0 ** 24, 2.0 ** -3)
    rows.view(-1)[::3] = (cancelling * rows.float().sign()).bfloat16().view(-1)[::3]
    if specials and rows.numel():
        flat = rows.view(-1)
        flat[:6] = torch.tensor([float("inf"), float("-inf"), -0.0, float("nan"), 3e38, -3e38])
    start = sum(splits[:me])
    own = rows[start:start + splits[me]]
    others = torch.cat((rows[:start], rows[start + splits[me]:]))
    return in_rank, splits, sent_tokens, own, others


@pytest.mark.parametrize("num_ranks,me", [(1, 0), (2, 0), (2, 1), (3, 1), (4, 3), (8, 5)])
@pytest.mark.parametrize("hidden", [4096, 40, 300])
@pytest.mark.parametrize("num_biases", [0, 1, 2])
def test_combine_equals_the_reference(num_ranks, me, hidden, num_biases):
    tokens = 23
    in_rank, splits, sent_tokens, own, others = _combine_case(num_ranks, me, tokens, hidden, seed=num_ranks * 10 + me,
                                                              specials=hidden == 300)
    biases = tuple(randn(tokens, hidden, seed=50 + i).bfloat16() for i in range(num_biases))
    waited = []
    call = CombineInputs(own, others, tuple(splits), me, sent_tokens, in_rank, biases, lambda: waited.append(1),
                         Workspace())
    got, want = ep_rows.combine_native(call), combine_reference(call)
    assert waited and got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    # the row sent nowhere is the biases alone
    assert torch.equal(got[-1].float(), sum((b[-1].float() for b in biases), torch.zeros(hidden)).bfloat16().float())


def test_combine_refuses_splits_that_the_layout_does_not_count():
    in_rank, splits, sent_tokens, own, others = _combine_case(3, 1, 16, 64, seed=7, specials=False)
    wrong = [splits[0] + 1, splits[1], splits[2] - 1]
    moved = torch.cat((others[:splits[0]], others[splits[0]:splits[0] + 1], others[splits[0] + 1:]))
    call = CombineInputs(own, moved, tuple(wrong), 1, sent_tokens, in_rank, (), lambda: None, Workspace())
    with pytest.raises(ContractError, match="does not count"):
        ep_rows.combine_native(call)


def test_the_registry_picks_native_for_bf16_and_the_reference_for_fp32():
    in_rank, splits, sent_tokens, own, others = _combine_case(2, 0, 16, 64, seed=3, specials=False)
    calls = {}
    for dtype in (torch.bfloat16, torch.float32):
        call = CombineInputs(own.to(dtype), others.to(dtype), tuple(splits), 0, sent_tokens, in_rank, (),
                             lambda: None, Workspace())
        with trace_providers() as ran:
            calls[dtype] = run_rows(COMBINE_ROWS, call)
        assert ran == [(COMBINE_ROWS.name, "cpu", "native" if dtype == torch.bfloat16 else "reference")]
    x = randn(16, 128, seed=4).bfloat16()
    dest_token = in_rank.T.nonzero(as_tuple=True)[1]
    with trace_providers() as ran:
        counts = in_rank.sum(dim=0).tolist()
        rows = poison(dest_token.numel(), 256, dtype=torch.uint8)
        run_rows(PACK_DISPATCH_ROWS, PackInputs(x, (), True, in_rank, dest_token, tuple(counts),
                                                _blocks(rows, counts, None),
                                                poison(dest_token.numel(), 4, dtype=torch.uint8)))
        run_rows(UNPACK_DISPATCH_META, UnpackInputs(poison(5, 4, dtype=torch.uint8), 0, None, 0, False, True, 0, 4, 5))
    assert [name for _, _, name in ran] == ["native", "native"]


@pytest.fixture
def two_threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


def test_the_threaded_passes_equal_the_reference(two_threads):
    """Sizes over the kernels' one-thread thresholds, so the OpenMP loops run (2 threads)."""
    tokens, hidden, num_ranks = 300, 4096, 4
    x = randn(tokens, hidden, seed=11).bfloat16()
    ids = torch.randint(-1, 32, (tokens, 4), generator=generator(12))
    in_rank = _in_rank(tokens, num_ranks, seed=13)
    dest_token = in_rank.T.nonzero(as_tuple=True)[1]
    counts = in_rank.sum(dim=0).tolist()
    packed = {}
    for name, fn in (("native", ep_rows.pack_native), ("reference", pack_reference)):
        rows = poison(dest_token.numel(), 2 * hidden, dtype=torch.uint8)
        meta = poison(dest_token.numel(), 36, dtype=torch.uint8)
        fn(PackInputs(x, (ids,), True, in_rank, dest_token, tuple(counts), _blocks(rows, counts, 3), meta))
        packed[name] = (rows, meta)
    assert torch.equal(packed["native"][0], packed["reference"][0])
    assert torch.equal(packed["native"][1], packed["reference"][1])
    in_rank, splits, sent_tokens, own, others = _combine_case(num_ranks, 2, tokens, hidden, seed=14, specials=True)
    bias = randn(tokens, hidden, seed=15).bfloat16()
    call = CombineInputs(own, others, tuple(splits), 2, sent_tokens, in_rank, (bias,), lambda: None, Workspace())
    assert torch.equal(ep_rows.combine_native(call).view(torch.int16), combine_reference(call).view(torch.int16))
