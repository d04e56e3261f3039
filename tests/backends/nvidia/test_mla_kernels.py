"""The Triton MLA decode (schedule, split-KV decode, combine) against the fp64 reference, with the
conformance kit's paged caches (NaN in unused slots, huge unused block_table entries)."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from portable_kernels.backends.nvidia.kernels import mla_decode, mla_metadata  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.ops.attention.decode import HEAD_DIM_V, mla_decode_reference  # noqa: E402
from portable_kernels.testing.generators import poison, randn  # noqa: E402
from portable_kernels.testing.mla_cases import (DecodeShape, build_paged_cache, check_decode,  # noqa: E402
                                                random_indices, random_kv)


def _covered(lengths: list[int], parts: int) -> None:
    """Every key tile of every batch is computed exactly once, by parts that own distinct slots."""
    meta, splits = mla_metadata.mla_schedule(torch.tensor(lengths, dtype=torch.int32), parts)
    tiles = [-(-n // mla_metadata.BLOCK_N) for n in lengths]
    cover = {i: [] for i in range(len(lengths))}
    slots = {i: [] for i in range(len(lengths))}
    for p in range(parts):
        begin, begin_tile, end, end_tile, slot, begin_touched, end_touched, _ = meta[p].tolist()
        for i in range(begin, end + 1):
            lo, hi = (begin_tile if i == begin else 0), (end_tile if i == end else tiles[i])
            if (begin < i < end) or (i == begin and begin_touched) or (i == end and i != begin and end_touched):
                slots[i].append(slot if i == begin else int(splits[i]))
                cover[i] += range(lo, hi)
            else:
                assert hi <= lo
    for i in range(len(lengths)):
        assert sorted(cover[i]) == list(range(tiles[i]))
        assert sorted(slots[i]) == list(range(int(splits[i]), int(splits[i + 1])))


def test_schedule_covers_every_tile_once():
    rng = random.Random(0)
    for _ in range(500):
        lengths = [rng.choice([0, 1, 64, 65, 700, rng.randint(0, 3000)]) for _ in range(rng.randint(0, 6))]
        _covered(lengths, rng.randint(1, 9))


def test_schedule_splits_long_batches():
    meta, splits = mla_metadata.mla_schedule(torch.tensor([4096, 10], dtype=torch.int32), 4)
    assert int(splits[1] - splits[0]) > 1 and int(splits[2] - splits[1]) == 1


SHAPES = [
    DecodeShape((70, 0, 1, 130, 700), s_q=1, h_q=16),
    DecodeShape((33, 64, 5), s_q=2, h_q=8, h_kv=2, d=512, block_size=16, causal=True),
    DecodeShape((3, 190), s_q=4, h_q=40, block_size=32, causal=True, softmax_scale=0.02),
    DecodeShape((65, 0, 300), s_q=1, h_q=16, fp8=True),
    DecodeShape((100, 0, 7), s_q=2, h_q=16, fp8=True, topk=200, block_size=16),
    # fp16 q, cache and out: a long batch split over several parts (combine), and a causal d=512 one
    DecodeShape((70, 0, 1, 130, 700), s_q=1, h_q=16, dtype=torch.float16),
    DecodeShape((33, 64, 5), s_q=2, h_q=8, h_kv=2, d=512, block_size=16, causal=True, dtype=torch.float16),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.label())
def test_decode_matches_reference(shape):
    seed = 7
    sequences = random_kv(shape.lengths, shape.h_kv, shape.d, seed=seed)
    paged = build_paged_cache(sequences, shape.block_size, seed=seed, fp8=shape.fp8, dtype=shape.dtype)
    indices = random_indices(paged, shape.s_q, shape.topk, seed=seed + 1)[0] if shape.topk else None
    b = len(shape.lengths)
    q = randn(b, shape.s_q, shape.h_q, shape.d, seed=seed + 2, dtype=shape.dtype)
    meta, splits = mla_metadata.get_mla_metadata(paged.cache_seqlens, shape.s_q * shape.h_q // shape.h_kv,
                                                 shape.h_kv, shape.topk)
    out = poison(b, shape.s_q, shape.h_q, HEAD_DIM_V, dtype=shape.dtype)
    lse = poison(b, shape.h_q, shape.s_q, dtype=torch.float32)
    scale = shape.softmax_scale or shape.d ** -0.5
    mla_decode.flash_mla_with_kvcache(q, paged.k_cache, paged.block_table, paged.cache_seqlens, scale, shape.causal,
                                      shape.fp8, indices, meta, splits, out, lse)
    ref_out, ref_lse = mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V,
                                            scale, shape.causal, shape.fp8, indices, dtype=torch.float64)
    check_decode(out, lse, ref_out, ref_lse)


def test_fp16_decode_splits_long_batches():
    """The fp16 shape above really runs the combine: its 700-token batch has several splits."""
    _, splits = mla_metadata.get_mla_metadata(torch.tensor([70, 0, 1, 130, 700], dtype=torch.int32), 16, 1)
    assert int((splits[1:] - splits[:-1]).max()) > 1


def test_fp16_q_with_the_fp8_cache_is_refused():
    paged = build_paged_cache(random_kv((5,), 1, 576, seed=3), 64, seed=3, fp8=True)
    q = randn(1, 1, 16, 576, seed=4, dtype=torch.float16)
    meta, splits = mla_metadata.get_mla_metadata(paged.cache_seqlens, 16, 1)
    out = torch.empty(1, 1, 16, HEAD_DIM_V, dtype=torch.float16)
    with pytest.raises(ContractError, match="bf16 q"):
        mla_decode.flash_mla_with_kvcache(q, paged.k_cache, paged.block_table, paged.cache_seqlens, 0.04, False,
                                          True, None, meta, splits, out, torch.empty(1, 16, 1))


def test_split_p_carries_p_beyond_bf16():
    """FlashMLA's bf16 P (split_p=False) is visibly less accurate on a short sequence than the
    default hi + lo P, which is why the default pays one more MMA per key tile."""
    paged = build_paged_cache(random_kv((5,), 1, 576, seed=3), 64, seed=3)
    q = randn(1, 1, 16, 576, seed=4, dtype=torch.bfloat16)
    meta, splits = mla_metadata.get_mla_metadata(paged.cache_seqlens, 16, 1)
    ref, _ = mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, 576 ** -0.5,
                                  dtype=torch.float64)
    errors = []
    for split_p in (True, False):
        out = torch.empty(1, 1, 16, HEAD_DIM_V, dtype=torch.bfloat16)
        lse = torch.empty(1, 16, 1)
        mla_decode.flash_mla_with_kvcache(q, paged.k_cache, paged.block_table, paged.cache_seqlens, 576 ** -0.5, False,
                                          False, None, meta, splits, out, lse, split_p=split_p)
        errors.append(float((out.double() - ref).abs().max()))
    assert errors[0] < errors[1]
