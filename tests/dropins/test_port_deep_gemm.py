"""DeepGEMM call sites ported with one import (`import portable_kernels.deep_gemm as deep_gemm`), in the
style of DeepGEMM's own tests (written here), checked with its published bars: calc_diff < 0.001 for
FP8 x FP8, < 0.01 for FP8 x FP4. The casts are checked byte for byte against DeepGEMM's documented
math (x * (1/sf); FP4 codes by midpoint thresholds, ties toward zero, +0), written out below."""

from __future__ import annotations

import random

import pytest
import torch

import portable_kernels as pk
import portable_kernels.deep_gemm as deep_gemm
from portable_kernels.deep_gemm.testing import calc_diff

FP8_BAR, FP8_FP4_BAR = 0.001, 0.01


@pytest.fixture(autouse=True)
def _seed_and_alignment():
    torch.manual_seed(0)
    random.seed(0)
    yield
    pk.set_mk_alignment_for_contiguous_layout(None)


# -- DeepGEMM's cast math, written from its definitions ------------------------------------------------

def dg_ceil_to_ue8m0(x):
    bits = x.abs().float().view(torch.int32)
    exp = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool().int()
    return (exp.clamp(1, 254) << 23).view(torch.float32)


def dg_per_token(x, use_ue8m0, gran_k=128):
    m, n = x.shape
    pad = -n % gran_k
    xv = torch.nn.functional.pad(x, (0, pad)).view(m, -1, gran_k)
    sf = xv.abs().float().amax(dim=2).clamp(1e-4) / 448.0
    sf = dg_ceil_to_ue8m0(sf) if use_ue8m0 else sf
    return (xv * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, -1)[:, :n].contiguous(), sf


def dg_per_block(x, use_ue8m0, gran_k=128):
    m, n = x.shape
    xp = torch.nn.functional.pad(x, (0, -n % gran_k, 0, -m % gran_k))
    xv = xp.view(-1, gran_k, xp.shape[1] // gran_k, gran_k)
    sf = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4) / 448.0
    sf = dg_ceil_to_ue8m0(sf) if use_ue8m0 else sf
    q = (xv * (1.0 / sf)).to(torch.float8_e4m3fn).view_as(xp)[:m, :n].contiguous()
    return q, sf.view(xv.shape[0], xv.shape[2])


def dg_per_channel(x, use_ue8m0, gran_k=128):
    m, n = x.shape
    xv = x.view(-1, gran_k, n)
    sf = xv.abs().float().amax(dim=1).clamp(1e-4) / 448.0
    sf = dg_ceil_to_ue8m0(sf) if use_ue8m0 else sf
    return (xv * (1.0 / sf.unsqueeze(1))).to(torch.float8_e4m3fn).view(m, n), sf


def dg_fp4_codes(x):
    code = torch.zeros_like(x, dtype=torch.uint8)
    for boundary in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        code += (x.abs() > boundary).to(torch.uint8)
    return code | (((x < 0) & (code != 0)).to(torch.uint8) << 3)


def dg_per_token_fp4(x, use_ue8m0, gran_k=128):
    m, n = x.shape
    xv = torch.nn.functional.pad(x, (0, -n % gran_k)).view(m, -1, gran_k)
    sf = xv.abs().float().amax(dim=2).clamp_min(1e-4) / 6.0
    sf = dg_ceil_to_ue8m0(sf) if use_ue8m0 else sf
    codes = dg_fp4_codes(xv * (1.0 / sf.unsqueeze(2))).view(m, -1)
    packed = (codes[:, 0::2] & 0xF) | (codes[:, 1::2] << 4)
    return packed[:, : n // 2].contiguous().view(torch.int8), sf


def _bytes(t):
    return t.contiguous().view(torch.uint8)


def _tie_heavy(rows: int, k: int) -> torch.Tensor:
    """Values on and around the rounding midpoints of e4m3 and e2m1 after scaling by odd scales."""
    grid = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.0, -0.0, 1e-3, -1e-3, 448.0, 13.0, 9.0, 0.5])
    x = grid[torch.randint(0, grid.numel(), (rows, k))] * torch.where(torch.rand(rows, k) < 0.5, -1.0, 1.0)
    return (x * torch.tensor([1.0, 3.0, 0.1, 7.0])[torch.arange(rows) % 4][:, None]).to(torch.bfloat16)


# -- casts: DeepGEMM's bytes ----------------------------------------------------------------------------

@pytest.mark.parametrize("make", ["random", "ties"])
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_fp8_casts_write_deepgemm_bytes(make, use_ue8m0):
    x = torch.randn(384, 640).to(torch.bfloat16) * 3 if make == "random" else _tie_heavy(384, 640)
    for mine, theirs in ((deep_gemm.per_token_cast_to_fp8(x, use_ue8m0), dg_per_token(x, use_ue8m0)),
                         (deep_gemm.per_token_cast_to_fp8(x, use_ue8m0, gran_k=32), dg_per_token(x, use_ue8m0, 32)),
                         (deep_gemm.per_block_cast_to_fp8(x, use_ue8m0), dg_per_block(x, use_ue8m0)),
                         (deep_gemm.per_channel_cast_to_fp8(x, use_ue8m0), dg_per_channel(x, use_ue8m0))):
        assert isinstance(mine, tuple) and len(mine) == 2
        assert torch.equal(_bytes(mine[0]), _bytes(theirs[0]))
        assert torch.equal(mine[1], theirs[1])


def test_division_and_reciprocal_differ_somewhere_so_the_convention_matters():
    x = torch.randn(512, 1024).to(torch.bfloat16) * 7
    portable = pk.per_token_cast_to_fp8(x)
    theirs = dg_per_token(x, False)
    assert not torch.equal(_bytes(portable.data), _bytes(theirs[0]))  # a few ties differ
    assert torch.equal(_bytes(deep_gemm.per_token_cast_to_fp8(x, False)[0]), _bytes(theirs[0]))


@pytest.mark.parametrize("make", ["random", "ties"])
@pytest.mark.parametrize("use_ue8m0,gran_k", [(True, 32), (True, 128), (False, 32)])
def test_fp4_cast_writes_deepgemm_bytes_as_int8(make, use_ue8m0, gran_k):
    x = torch.randn(64, 256).to(torch.bfloat16) * 2 if make == "random" else _tie_heavy(64, 256)
    data, sf = deep_gemm.per_token_cast_to_fp4(x, use_ue8m0, gran_k)
    want_data, want_sf = dg_per_token_fp4(x, use_ue8m0, gran_k)
    assert data.dtype == torch.int8
    assert torch.equal(data, want_data) and torch.equal(sf, want_sf)


def test_fp4_ties_round_toward_zero_and_tiny_negatives_are_plus_zero():
    x = torch.tensor([[6.0, 0.75, 1.75, 3.5, -1e-3, -0.0, 2.5, 5.0]], dtype=torch.bfloat16)
    data, _ = deep_gemm.per_token_cast_to_fp4(x, True, gran_k=32)
    codes = pk.layouts.unpack_e2m1(data).tolist()[0]
    assert codes == [0x7, 0x1, 0x3, 0x5, 0x0, 0x0, 0x4, 0x6]
    portable = pk.layouts.unpack_e2m1(pk.per_token_cast_to_fp4(x.float(), gran_k=32).data).tolist()[0]
    assert portable[1:4] == [0x2, 0x4, 0x6] and portable[4] == 0x8  # ties to even, -0 kept


def test_packed_ue8m0_scales_match_deepgemm_packing():
    x = torch.randn(8, 512).to(torch.bfloat16)
    _, packed = deep_gemm.per_token_cast_to_fp8(x, True, use_packed_ue8m0=True)
    _, sf = dg_per_token(x, True)
    assert packed.dtype == torch.int32 and packed.shape == (8, 1)
    assert torch.equal(packed, (sf.view(torch.int32) >> 23).to(torch.uint8).view(torch.int32))
    _, fp4_packed = deep_gemm.per_token_cast_to_fp4(x[:, :64], True, gran_k=32, use_packed_ue8m0=True)
    assert (fp4_packed.view(torch.uint8)[:, 2:] == 127).all()  # two real scales, padded with 1.0 as DeepGEMM


def test_transpose_packed_fp4_and_cast_back():
    x = torch.randn(64, 128).to(torch.bfloat16)
    data, sf = deep_gemm.per_token_cast_to_fp4(x, True, gran_k=32)
    back = deep_gemm.cast_back_from_fp4(data, sf, gran_k=32)
    assert calc_diff(back, x.float()) < 0.02 and not torch.signbit(back[back == 0]).any()
    t = deep_gemm.transpose_packed_fp4(data)
    codes = pk.layouts.unpack_e2m1(data)
    assert t.dtype == torch.int8 and torch.equal(pk.layouts.unpack_e2m1(t), codes.T)


def test_math_helpers():
    assert deep_gemm.ceil_div(129, 128) == 2 and deep_gemm.align(129, 128) == 256
    x = torch.tensor([0.3, -1.5, 0.0, 1.0, float("inf")])
    assert torch.equal(deep_gemm.ceil_to_ue8m0(x), dg_ceil_to_ue8m0(x))


# -- GEMMs --------------------------------------------------------------------------------------------

def _normal(m, n, k, layout, accumulate, out_dtype, is_fp4_b=False):
    a = torch.randn(m, k, dtype=torch.bfloat16)
    b = torch.randn(n, k, dtype=torch.bfloat16)
    d = torch.randn(m, n, dtype=out_dtype) * 32 if accumulate else torch.empty(m, n, dtype=out_dtype)
    c = d if accumulate else None
    ref = (a.float() @ b.float().T + (c if accumulate else 0)).to(out_dtype)
    a_q = deep_gemm.per_token_cast_to_fp8(a, use_ue8m0=False)
    b_q = deep_gemm.per_token_cast_to_fp4(b, use_ue8m0=True, gran_k=32) if is_fp4_b else \
        deep_gemm.per_block_cast_to_fp8(b, use_ue8m0=False)
    if layout[0] == "t":
        a_q = (a_q[0].T.contiguous(), a_q[1].T.contiguous())
    if layout[1] == "n":
        b_q = (b_q[0].T.contiguous(), b_q[1].T.contiguous())
    return a_q, b_q, c, d, ref


@pytest.mark.parametrize("layout", ["nt", "nn", "tn", "tt"])
@pytest.mark.parametrize("accumulate,out_dtype", [(False, torch.bfloat16), (True, torch.float32)])
def test_fp8_gemm_every_layout(layout, accumulate, out_dtype):
    for m, n, k in ((1, 256, 512), (128, 576, 1024)):
        a, b, c, d, ref = _normal(m, n, k, layout, accumulate, out_dtype)
        getattr(deep_gemm, f"fp8_gemm_{layout}")(a, b, d, c=c, disable_ue8m0_cast=True)
        assert calc_diff(d, ref) < FP8_BAR


def test_fp8_fp4_gemm_with_operand_recipes():
    a, b, c, d, ref = _normal(64, 384, 1024, "nt", False, torch.bfloat16, is_fp4_b=True)
    deep_gemm.fp8_fp4_gemm_nt(a, b, d, recipe_a=(1, 128), recipe_b=(1, 32))
    assert calc_diff(d, ref) < FP8_FP4_BAR


def test_wgrad_recipe_with_per_token_b():
    a = torch.randn(256, 512, dtype=torch.bfloat16)
    b = torch.randn(128, 512, dtype=torch.bfloat16)
    d = torch.randn(256, 128) * 32
    ref = a.float() @ b.float().T + d
    deep_gemm.fp8_gemm_nt(deep_gemm.per_token_cast_to_fp8(a, False), deep_gemm.per_token_cast_to_fp8(b, False), d,
                          c=d, recipe=(1, 1, 128))
    assert calc_diff(d, ref) < FP8_BAR


def test_sm100_packed_int32_scales_are_accepted_in_raw_pairs():
    a = torch.randn(32, 512, dtype=torch.bfloat16)
    b = torch.randn(64, 512, dtype=torch.bfloat16)
    a_q, b_q = deep_gemm.per_token_cast_to_fp8(a, True), deep_gemm.per_token_cast_to_fp8(b, True)
    packed_a = (a_q[0], deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(a_q[1]))
    packed_b = (b_q[0], deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(b_q[1]))
    d1, d2 = torch.empty(32, 64), torch.empty(32, 64)
    deep_gemm.fp8_gemm_nt(a_q, b_q, d1, recipe=(1, 1, 128))
    deep_gemm.fp8_gemm_nt(packed_a, packed_b, d2, recipe=(1, 1, 128))
    assert torch.equal(d1, d2) and calc_diff(d1, a.float() @ b.float().T) < FP8_BAR


def test_bf16_gemm_every_layout_and_cublaslt():
    a, b = torch.randn(33, 256, dtype=torch.bfloat16), torch.randn(70, 256, dtype=torch.bfloat16)
    ref = a.float() @ b.float().T
    for layout in ("nt", "nn", "tn", "tt"):
        aa = a.T.contiguous() if layout[0] == "t" else a
        bb = b.T.contiguous() if layout[1] == "n" else b
        for fn in (getattr(deep_gemm, f"bf16_gemm_{layout}"), getattr(deep_gemm, f"cublaslt_gemm_{layout}")):
            d = torch.empty(33, 70, dtype=torch.bfloat16)
            fn(aa, bb, d)
            assert calc_diff(d, ref) < 1e-4


def test_keyword_errors_are_typed():
    a, b, _, d, _ = _normal(4, 128, 128, "nt", False, torch.bfloat16)
    with pytest.raises(pk.ContractError, match="compiled_dims"):
        deep_gemm.fp8_gemm_nt(a, b, d, compiled_dims="xyz")
    with pytest.raises(pk.ContractError, match="recipe"):
        deep_gemm.fp8_gemm_nt(a, b, d, recipe=(1, 128, 128), recipe_a=(1, 128), recipe_b=(128, 128))
    with pytest.raises(pk.ContractError, match="'a'"):
        deep_gemm.fp8_fp4_gemm_nt(deep_gemm.per_token_cast_to_fp4(torch.randn(4, 128), True, 32), b, d)


# -- m-grouped ------------------------------------------------------------------------------------------

def _m_grouped_contiguous(num_groups, expected_m, n, k, use_psum_layout, is_fp4_b=False, use_ue8m0=False):
    actual = [int(expected_m * random.uniform(0.7, 1.3)) for _ in range(num_groups)]
    alignment = deep_gemm.get_mk_alignment_for_contiguous_layout()
    aligned = [deep_gemm.align(x, alignment) for x in actual]
    m = sum(aligned)
    a = torch.randn(m, k, dtype=torch.bfloat16)
    b = torch.randn(num_groups, n, k, dtype=torch.bfloat16)
    layout = torch.empty(num_groups if use_psum_layout else m, dtype=torch.int32)
    d = torch.empty(m, n, dtype=torch.bfloat16)
    ref = torch.randn(m, n, dtype=torch.bfloat16)
    start = 0
    for i, (x, y) in enumerate(zip(actual, aligned)):
        if use_psum_layout:
            layout[i] = start + x
        else:
            layout[start:start + x] = i
            layout[start + x:start + y] = -1
        a[start + x:start + y] = 0
        ref[start:start + y] = a[start:start + y] @ b[i].t()
        start += y
    a_q = deep_gemm.per_token_cast_to_fp8(a, use_ue8m0)
    if is_fp4_b:
        b_q = [deep_gemm.per_token_cast_to_fp4(b[i], True, 32) for i in range(num_groups)]
        b_q = (torch.stack([q[0] for q in b_q]), torch.stack([q[1] for q in b_q]))
    else:
        b_q = [deep_gemm.per_block_cast_to_fp8(b[i], use_ue8m0) for i in range(num_groups)]
        b_q = (torch.stack([q[0] for q in b_q]), torch.stack([q[1] for q in b_q]))
    return m, a_q, b_q, layout, d, ref


def _check_psum_zero_padding(a, d, layout):
    for current in layout.tolist():
        aligned = deep_gemm.align(current, deep_gemm.get_mk_alignment_for_contiguous_layout())
        assert torch.equal(d[current:aligned], torch.zeros_like(d[current:aligned]))


@pytest.mark.parametrize("use_psum_layout", [False, True])
@pytest.mark.parametrize("is_fp4_b", [False, True])
def test_m_grouped_contiguous_like_deepgemm(use_psum_layout, is_fp4_b):
    bar = FP8_FP4_BAR if is_fp4_b else FP8_BAR
    recipes = dict(recipe_a=(1, 128), recipe_b=(1, 32)) if is_fp4_b else {}
    m, a, b, layout, d, ref = _m_grouped_contiguous(3, 96, 128, 256, use_psum_layout, is_fp4_b)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=use_psum_layout, **recipes)
    if use_psum_layout:
        for j in range(3):
            start = 0 if j == 0 else deep_gemm.align(int(layout[j - 1]), deep_gemm.get_mk_alignment_for_contiguous_layout())
            assert calc_diff(d[start:int(layout[j])], ref[start:int(layout[j])]) < bar
        _check_psum_zero_padding(a, d, layout)
    else:
        assert calc_diff(d, ref) < bar  # padding rows included: zeroed like DeepGEMM's


@pytest.mark.parametrize("bf16", [False, True])
def test_m_indices_padding_rows_are_written_without_ensure_zero_padding(bf16):
    """DeepGEMM computes every row of a block, so its -1 rows are the GEMM of their zeroed A rows."""
    m, a, b, layout, d, ref = _m_grouped_contiguous(3, 96, 128, 256, False)
    d.fill_(float("nan"))
    if bf16:
        a16 = torch.randn(m, 256, dtype=torch.bfloat16).masked_fill((layout < 0)[:, None], 0)
        b16 = torch.randn(3, 128, 256, dtype=torch.bfloat16)
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a16, b16, d, layout, ensure_zero_padding=False)
    else:
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, layout, ensure_zero_padding=False)
        assert calc_diff(d, ref) < FP8_BAR
    assert torch.equal(d[layout < 0], torch.zeros_like(d[layout < 0]))


def test_m_grouped_nn_takes_b_transposed():
    m, a, b, layout, d, ref = _m_grouped_contiguous(2, 64, 128, 256, False)
    deep_gemm.m_grouped_fp8_gemm_nn_contiguous(a, (b[0].mT.contiguous(), b[1].mT.contiguous()), d, layout)
    assert calc_diff(d, ref) < FP8_BAR


def test_the_issue_alignment_224_psum_is_read_with_224_once_set():
    """DeepGEMM's SM100 tests set the alignment to its block size (224) and build layouts with it."""
    with pk.use_backend("nvidia", arch="sm100"):
        alignment = deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout()
        assert alignment == 224
        deep_gemm.set_mk_alignment_for_contiguous_layout(alignment)
        for use_psum_layout in (True, False):
            m, a, b, layout, d, ref = _m_grouped_contiguous(4, 200, 64, 256, use_psum_layout, use_ue8m0=True)
            deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=use_psum_layout,
                                                       disable_ue8m0_cast=False)
            assert calc_diff(d, ref) < FP8_BAR  # every row of every group computed, padding zero
    deep_gemm.set_mk_alignment_for_contiguous_layout(224)
    _, a, b, m_indices, d, _ = _m_grouped_contiguous(3, 200, 64, 256, False)
    deep_gemm.set_mk_alignment_for_contiguous_layout(128)  # now the layout disagrees with the setting
    with pytest.raises(pk.ContractError, match="m_indices"):
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)


def test_m_grouped_masked_and_its_psum_form():
    num_groups, max_m, n, k = 3, 64, 128, 256
    a = torch.randn(num_groups, max_m, k, dtype=torch.bfloat16)
    b = torch.randn(num_groups, n, k, dtype=torch.bfloat16)
    ref = torch.einsum("gmk,gnk->gmn", a, b)
    masked_m = torch.tensor([40, 0, 64], dtype=torch.int32)
    a_q = [deep_gemm.per_token_cast_to_fp8(a[i], False) for i in range(num_groups)]
    b_q = [deep_gemm.per_block_cast_to_fp8(b[i], False) for i in range(num_groups)]
    a_q = (torch.stack([q[0] for q in a_q]), torch.stack([q[1] for q in a_q]))
    b_q = (torch.stack([q[0] for q in b_q]), torch.stack([q[1] for q in b_q]))
    d = torch.empty(num_groups, max_m, n, dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_gemm_nt_masked(a_q, b_q, d, masked_m, 48)
    for j in (0, 2):
        assert calc_diff(d[j, :masked_m[j]], ref[j, :masked_m[j]]) < FP8_BAR
    # the same groups in the psum layout (DeepGEMM's layout_masked_to_psum)
    alignment = deep_gemm.get_mk_alignment_for_contiguous_layout()
    psum, last = [], 0
    a_psum = torch.zeros(num_groups * max_m, k, dtype=torch.float8_e4m3fn)
    sf_psum = torch.ones(num_groups * max_m, a_q[1].shape[-1])
    for j in range(num_groups):
        end = last + int(masked_m[j])
        a_psum[last:end], sf_psum[last:end] = a_q[0][j, :masked_m[j]], a_q[1][j, :masked_m[j]]
        psum.append(end)
        last = deep_gemm.align(end, alignment)
    d_psum = torch.empty(num_groups * max_m, n, dtype=torch.bfloat16)
    psum = torch.tensor(psum, dtype=torch.int32)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a_psum, sf_psum), b_q, d_psum, psum, use_psum_layout=True,
                                               expected_m_for_psum_layout=48)
    assert calc_diff(d_psum[psum[1]:psum[2]], ref[2, :64]) < FP8_BAR


def _masked_ue8m0_operands(masked_m, max_m=64, n=128, k=256):
    g = masked_m.numel()
    a = torch.randn(g, max_m, k, dtype=torch.bfloat16)
    b = torch.randn(g, n, k, dtype=torch.bfloat16)
    a_q = [deep_gemm.per_token_cast_to_fp8(a[i], True) for i in range(g)]
    b_q = [deep_gemm.per_block_cast_to_fp8(b[i], True) for i in range(g)]
    a_q = (torch.stack([q[0] for q in a_q]), torch.stack([q[1] for q in a_q]))
    b_q = (torch.stack([q[0] for q in b_q]), torch.stack([q[1] for q in b_q]))
    return a, b, a_q, b_q


def test_sm100_accepts_zero_scales_in_rows_beyond_masked_m_and_refuses_them_in_read_rows():
    masked_m = torch.tensor([40, 0, 64], dtype=torch.int32)
    a, b, a_q, b_q = _masked_ue8m0_operands(masked_m)
    for j in range(3):
        a_q[1][j, int(masked_m[j]):] = 0  # as DeepGEMM's generator: the pack kernel reads regular zeros
    d = torch.empty(3, 64, 128, dtype=torch.bfloat16)
    ref = torch.einsum("gmk,gnk->gmn", a.float(), b.float())
    with pk.use_backend("nvidia", arch="sm100"):
        deep_gemm.m_grouped_fp8_gemm_nt_masked(a_q, b_q, d, masked_m, 48, disable_ue8m0_cast=False)
        assert calc_diff(d[0, :40], ref[0, :40]) < FP8_BAR and calc_diff(d[2], ref[2]) < FP8_BAR
        a_q[1][0, 39, 0] = 3.0  # a row the GEMM reads
        with pytest.raises(pk.LayoutError, match="powers of two"):
            deep_gemm.m_grouped_fp8_gemm_nt_masked(a_q, b_q, d, masked_m, 48, disable_ue8m0_cast=False)


def test_sm100_accepts_uninitialised_psum_gap_rows_and_refuses_bad_scales_in_read_rows():
    masked_m = torch.tensor([40, 0, 64], dtype=torch.int32)
    a, b, a_q, b_q = _masked_ue8m0_operands(masked_m)
    alignment = deep_gemm.get_mk_alignment_for_contiguous_layout()
    a_psum = torch.full((3 * 64, 256), float("nan")).to(torch.float8_e4m3fn)  # gaps: garbage, as torch.empty
    sf_psum = torch.full((3 * 64, a_q[1].shape[-1]), -3.7)
    psum, last = [], 0
    for j in range(3):
        end = last + int(masked_m[j])
        a_psum[last:end], sf_psum[last:end] = a_q[0][j, :masked_m[j]], a_q[1][j, :masked_m[j]]
        psum.append(end)
        last = deep_gemm.align(end, alignment)
    psum = torch.tensor(psum, dtype=torch.int32)
    d = torch.empty(3 * 64, 128, dtype=torch.bfloat16)
    ref = torch.einsum("gmk,gnk->gmn", a.float(), b.float())
    with pk.use_backend("nvidia", arch="sm100"):
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a_psum, sf_psum), b_q, d, psum, use_psum_layout=True,
                                                   disable_ue8m0_cast=False)
        assert calc_diff(d[:40], ref[0, :40]) < FP8_BAR
        assert calc_diff(d[int(psum[1]):int(psum[2])], ref[2]) < FP8_BAR
        sf_psum[0, 0] = 3.0  # a row the GEMM reads
        with pytest.raises(pk.LayoutError, match="powers of two"):
            deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a_psum, sf_psum), b_q, d, psum, use_psum_layout=True,
                                                       disable_ue8m0_cast=False)


def test_m_grouped_bf16_contiguous_and_masked():
    m, _, _, layout, d, _ = _m_grouped_contiguous(2, 64, 64, 128, False)
    a = torch.randn(m, 128, dtype=torch.bfloat16)
    b = torch.randn(2, 64, 128, dtype=torch.bfloat16)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout)
    d2 = torch.empty_like(d)
    deep_gemm.m_grouped_bf16_gemm_nn_contiguous(a, b.mT.contiguous(), d2, layout)
    assert torch.equal(d, d2) and not d[layout < 0].any()


# -- k-grouped ------------------------------------------------------------------------------------------

def _k_grouped_cast(x, ks, ends=None):
    data = torch.zeros(x.shape, dtype=torch.float8_e4m3fn)
    sfs, start = [], 0
    for i, k in enumerate(ks):
        start = (ends[i] - k) if ends is not None else start
        if k:
            group = torch.zeros(deep_gemm.align(k, 128), x.shape[1], dtype=x.dtype)
            group[:k] = x[start:start + k]
            q, sf = deep_gemm.per_channel_cast_to_fp8(group, use_ue8m0=False)
            data[start:start + k] = q[:k]
            sfs.append(sf)
        if ends is None:
            start += k
    return data, torch.cat(sfs)


def test_k_grouped_tn_contiguous_with_and_without_psum():
    num_groups, m, n = 3, 64, 96
    ks = [256, 0, 384]
    k = sum(ks)
    a, b = torch.randn(k, m, dtype=torch.bfloat16), torch.randn(k, n, dtype=torch.bfloat16)
    c = torch.randn(num_groups, m, n) * 32
    ref, start = torch.empty_like(c), 0
    for i, gk in enumerate(ks):
        ref[i] = c[i] + a[start:start + gk].float().T @ b[start:start + gk].float()
        start += gk
    d = c.clone()
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous(_k_grouped_cast(a, ks), _k_grouped_cast(b, ks), d, ks,
                                               torch.tensor(ks, dtype=torch.int32), d, recipe=(1, 1, 128))
    assert calc_diff(d, ref) < FP8_BAR
    # psum form: real K 200 / 0 / 300 at starts aligned to 128, ks_cpu None and [] (unsynced paths)
    real = [200, 0, 300]
    ends, prev = [], 0
    for gk in real:
        ends.append(deep_gemm.align(prev, 128) + gk)
        prev = ends[-1]
    total = deep_gemm.align(ends[-1], 128)
    a2, b2 = torch.zeros(total, m, dtype=torch.bfloat16), torch.zeros(total, n, dtype=torch.bfloat16)
    ref2 = c.clone()
    for i, gk in enumerate(real):
        a2[ends[i] - gk:ends[i]], b2[ends[i] - gk:ends[i]] = torch.randn(gk, m), torch.randn(gk, n)
        ref2[i] += a2[ends[i] - gk:ends[i]].float().T @ b2[ends[i] - gk:ends[i]].float()
    for ks_cpu in (None, []):
        d2 = c.clone()
        deep_gemm.k_grouped_fp8_gemm_tn_contiguous(_k_grouped_cast(a2, real, ends), _k_grouped_cast(b2, real, ends), d2,
                                                   ks_cpu, torch.tensor(ends, dtype=torch.int32), d2,
                                                   recipe=(1, 1, 128), use_psum_layout=True)
        assert calc_diff(d2, ref2) < FP8_BAR


def test_k_grouped_nt_contiguous_flat_k_major_groups():
    ks, m, n = [128, 256], 32, 48
    a, b = torch.randn(sum(ks), m, dtype=torch.bfloat16), torch.randn(sum(ks), n, dtype=torch.bfloat16)
    (qa, sfa), (qb, sfb) = _k_grouped_cast(a, ks), _k_grouped_cast(b, ks)
    flat_a = torch.cat([qa[s:s + k].T.contiguous().flatten() for s, k in ((0, 128), (128, 256))])
    flat_b = torch.cat([qb[s:s + k].T.contiguous().flatten() for s, k in ((0, 128), (128, 256))])
    c = torch.randn(2, m, n)
    d = torch.empty(2, m, n)
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous((flat_a, sfa.T), (flat_b, sfb.T), d, ks,
                                               torch.tensor(ks, dtype=torch.int32), c)
    ref = torch.stack([c[0] + a[:128].float().T @ b[:128].float(), c[1] + a[128:].float().T @ b[128:].float()])
    assert calc_diff(d, ref) < FP8_BAR


# -- layout utilities and runtime ----------------------------------------------------------------------

def _packed_reference(x):
    """DeepGEMM's torch definition of get_mn_major_tma_aligned_packed_ue8m0_tensor, written out."""
    e = (x.view(torch.int32) >> 23).to(torch.uint8)
    squeeze = x.dim() == 2
    x3, e = (x.unsqueeze(0), e.unsqueeze(0)) if squeeze else (x, e)
    b, mn, k = x3.shape
    amn, ak = deep_gemm.get_tma_aligned_size(mn, 4), deep_gemm.align(k, 4)
    padded = torch.zeros(b, amn, ak, dtype=torch.uint8)
    padded[:, :mn, :k] = e
    padded = padded.view(-1).view(torch.int32).view(b, amn, ak // 4)
    out = torch.zeros(b, ak // 4, amn, dtype=torch.int32).mT
    out[:] = padded
    out = out[:, :mn, :]
    return out.squeeze(0) if squeeze else out


@pytest.mark.parametrize("mn,k,groups", [(130, 7296, 1), (64, 128, 2), (5, 512, 3)])
def test_sf_layout_utilities_match_deepgemm(mn, k, groups):
    x = torch.randn(groups * mn, k, dtype=torch.bfloat16)
    _, sf = deep_gemm.per_token_cast_to_fp8(x, use_ue8m0=True)
    sf = sf if groups == 1 else sf.view(groups, mn, -1)
    packed, want = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf), _packed_reference(sf)
    assert torch.equal(packed, want) and packed.stride() == want.stride()
    aligned = deep_gemm.get_mn_major_tma_aligned_tensor(sf)
    amn = deep_gemm.get_tma_aligned_size(mn, 4)
    assert torch.equal(aligned, sf) and aligned.stride()[-2:] == (1, amn)
    assert deep_gemm.get_col_major_tma_aligned_tensor is deep_gemm.get_mn_major_tma_aligned_tensor


def test_transform_sf_into_required_layout_per_architecture():
    x = torch.randn(130, 512, dtype=torch.bfloat16)
    _, sfa = deep_gemm.per_token_cast_to_fp8(x, use_ue8m0=True)
    _, sfb = deep_gemm.per_block_cast_to_fp8(x, use_ue8m0=True)
    sm90 = deep_gemm.transform_sf_into_required_layout(sfa, 130, 512, (1, 128, 128), is_sfa=True)
    assert sm90.dtype == torch.float32 and sm90.stride() == (1, 132)
    with pk.use_backend("nvidia", arch="sm100"):
        a100 = deep_gemm.transform_sf_into_required_layout(sfa, 130, 512, (1, 128, 128), is_sfa=True)
        b100 = deep_gemm.transform_sf_into_required_layout(sfb, 130, 512, (1, 128, 128), is_sfa=False)
        assert a100.dtype == torch.int32 and torch.equal(a100, _packed_reference(sfa))
        assert torch.equal(b100, _packed_reference(sfb.repeat_interleave(128, 0)[:130]))
        assert deep_gemm.transform_sf_into_required_layout(a100, 130, 512, (1, 128), None) is a100


def test_alignment_and_sm_settings():
    assert deep_gemm.get_mk_alignment_for_contiguous_layout() == 128
    deep_gemm.set_mk_alignment_for_contiguous_layout(192)
    assert deep_gemm.get_mk_alignment_for_contiguous_layout() == pk.get_m_alignment_for_contiguous_layout() == 192
    mapping = pk.get_fused_mapping(torch.tensor([[0, 1]]), 2)  # get_fused_mapping's default follows the setting
    assert mapping.num_tokens_per_expert.tolist() == [192, 192]
    with pytest.raises(pk.ContractError):
        deep_gemm.set_mk_alignment_for_contiguous_layout(0)
    assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout() == 128
    with pk.use_backend("nvidia", arch="sm100"):
        assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout(100) == 128
    sms = deep_gemm.get_num_sms()
    deep_gemm.set_num_sms(1)
    assert deep_gemm.get_num_sms() == 1
    deep_gemm.set_num_sms(sms)


#: DeepGEMM 2.6.1's public names in scope (the indexer kernels since the lightning-indexer contract) (docs/porting.md lists what is out of scope and why)
DEEPGEMM_SCOPE = """
fp8_gemm_nt fp8_gemm_nn fp8_gemm_tn fp8_gemm_tt fp8_fp4_gemm_nt fp8_fp4_gemm_nn fp8_fp4_gemm_tn fp8_fp4_gemm_tt
bf16_gemm_nt bf16_gemm_nn bf16_gemm_tn bf16_gemm_tt cublaslt_gemm_nt cublaslt_gemm_nn cublaslt_gemm_tn cublaslt_gemm_tt
m_grouped_fp8_gemm_nt_contiguous m_grouped_fp8_gemm_nn_contiguous m_grouped_fp8_gemm_nt_masked
m_grouped_fp8_fp4_gemm_nt_contiguous m_grouped_fp8_fp4_gemm_nn_contiguous m_grouped_fp8_fp4_gemm_nt_masked
m_grouped_bf16_gemm_nt_contiguous m_grouped_bf16_gemm_nn_contiguous m_grouped_bf16_gemm_nt_masked
k_grouped_fp8_gemm_tn_contiguous k_grouped_fp8_gemm_nt_contiguous k_grouped_bf16_gemm_tn_contiguous
fp8_m_grouped_gemm_nt_masked bf16_m_grouped_gemm_nt_masked
per_token_cast_to_fp8 per_channel_cast_to_fp8 per_block_cast_to_fp8 per_custom_dims_cast_to_fp8 per_token_cast_to_fp4
transpose_packed_fp4 cast_back_from_fp4 pack_ue8m0_to_int unpack_ue8m0_from_int ceil_div align ceil_to_ue8m0
get_tma_aligned_size get_mn_major_tma_aligned_tensor get_col_major_tma_aligned_tensor
get_mn_major_tma_aligned_packed_ue8m0_tensor get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor
transform_sf_into_required_layout get_mk_alignment_for_contiguous_layout set_mk_alignment_for_contiguous_layout
get_theoretical_mk_alignment_for_contiguous_layout get_m_alignment_for_contiguous_layout
get_k_alignment_for_contiguous_layout get_num_sms set_num_sms testing.calc_diff testing.count_bytes
fp8_mqa_logits fp8_paged_mqa_logits fp8_fp4_mqa_logits fp8_fp4_paged_mqa_logits get_paged_mqa_logits_metadata
fp8_gemm_nt_skip_head_mid tf32_hc_prenorm_gemm einsum fp8_einsum
""".split()
NOT_PROVIDED: set[str] = set()


def test_every_public_name_in_scope_is_provided():
    def has(name):
        obj = deep_gemm
        for part in name.split("."):
            obj = getattr(obj, part, None)
        return callable(obj)

    provided = {name for name in DEEPGEMM_SCOPE if has(name)}
    assert len(DEEPGEMM_SCOPE) == 66 and set(DEEPGEMM_SCOPE) - provided == NOT_PROVIDED
    assert deep_gemm.fp8_gemm_nt is deep_gemm.fp8_fp4_gemm_nt  # one function, as in DeepGEMM
