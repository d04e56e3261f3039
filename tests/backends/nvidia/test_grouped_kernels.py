"""The Triton grouped GEMM kernels (contiguous, psum, masked; fp8 in each scale form, bf16) against
the dequantized fp64 reference; padding rows must keep their poison."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from portable_kernels.backends.nvidia.kernels import grouped_contiguous, grouped_masked  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.ops.gemm.grouped import grouped_gemm_contiguous_reference, grouped_gemm_masked_reference  # noqa: E402
from portable_kernels.layouts import contiguous_m_indices, psum_layout  # noqa: E402
from portable_kernels.core.numerics import calc_diff  # noqa: E402
from portable_kernels.testing.generators import poison, randn  # noqa: E402

from nvidia_operands import FORMS, dequantized, quantized, storage  # noqa: E402

COUNTS = [5, 0, 70, 1]  # an empty group, a one-row group, a segment of several row tiles


def _config_id(config) -> str:
    return "x".join(map(str, config.kwargs.values()))


def _contiguous_case(counts, alignment, psum):
    counts_t = torch.tensor(counts)
    m_indices = contiguous_m_indices(counts_t, alignment)
    layout = psum_layout(counts_t, alignment) if psum else m_indices
    return m_indices, layout


def _check_fp8_contiguous(form: str, psum: bool, counts, alignment: int, n: int, k: int, seed: int) -> None:
    """The fp8 contiguous kernel on `form` scales: valid rows match the reference from dequantized
    operands, padding rows stay poisoned."""
    m_indices, layout = _contiguous_case(counts, alignment, psum)
    m, g = m_indices.numel(), len(counts)
    ue8m0 = form == "sm100"
    qa = quantized((m, k), (1, 128), ue8m0, seed=seed)
    qb = quantized((g, n, k), (128, 128), ue8m0, seed=seed + 1, scale=k ** -0.5)
    sfa, ga = storage(qa, form)
    sfb, gb = storage(qb, form)
    d = poison(m, n, dtype=torch.float32)
    grouped_contiguous.m_grouped_gemm_nt_contiguous(qa.data, qb.data, d, layout, sfa=sfa, sfb=sfb, gran_a=ga,
                                                    gran_b=gb, use_psum_layout=psum, alignment=alignment)
    valid = m_indices >= 0
    ref = grouped_gemm_contiguous_reference(dequantized(qa), dequantized(qb), m_indices)
    assert torch.isnan(d[~valid]).all()
    assert calc_diff(d[valid], ref[valid]) < 1e-9


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("psum", [False, True])
def test_fp8_contiguous(form, psum):
    _check_fp8_contiguous(form, psum, COUNTS, 64, n=40, k=200, seed=1)


@pytest.mark.parametrize("config", grouped_contiguous.CONFIGS[2:], ids=_config_id)
def test_bf16_contiguous_alignment_256(config):
    alignment, n, k = 256, 70, 96
    m_indices, layout = _contiguous_case([3, 200], alignment, False)
    m = m_indices.numel()
    a = randn(m, k, seed=3, dtype=torch.bfloat16)
    b = randn(2, n, k, seed=4, dtype=torch.bfloat16)
    d = poison(m, n, dtype=torch.bfloat16)
    grouped_contiguous.m_grouped_gemm_nt_contiguous(a, b, d, layout, alignment=alignment, config=config)
    valid = m_indices >= 0
    assert torch.isnan(d[~valid].float()).all()
    ref = grouped_gemm_contiguous_reference(a.double(), b.double(), m_indices)
    assert calc_diff(d[valid], ref[valid]) < 1e-5


def test_contiguous_skips_out_of_range_groups():
    """A group id >= G (possible on a GPU, where layouts are not value-checked) is never read."""
    a = randn(64, 32, seed=5, dtype=torch.bfloat16)
    b = randn(1, 16, 32, seed=6, dtype=torch.bfloat16)
    d = poison(64, 16, dtype=torch.float32)
    grouped_contiguous.m_grouped_gemm_nt_contiguous(a, b, d, torch.full((64,), 7, dtype=torch.int32), alignment=64)
    assert torch.isnan(d).all()


#: segments whose boundaries fall inside row tiles: DeepGEMM's SM100 224, a multiple of 8 only,
#: and 1 (groups back to back, several in one tile)
ODD_ALIGNMENTS = (224, 24, 1)
ODD_COUNTS = [200, 0, 3, 20, 1, 57]


def test_odd_alignments_put_segment_boundaries_inside_row_tiles():
    """The cases below really exercise several groups per tile, for every config's BLOCK_M."""
    for alignment in ODD_ALIGNMENTS:
        m_indices = contiguous_m_indices(torch.tensor(ODD_COUNTS), alignment)
        for block_m in {c.kwargs["BLOCK_M"] for c in grouped_contiguous.CONFIGS}:
            tiles = torch.nn.functional.pad(m_indices, (0, -m_indices.numel() % block_m), value=-1).view(-1, block_m)
            per_tile = [len(set(t[t >= 0].tolist())) for t in tiles]
            assert max(per_tile) >= 2, (alignment, block_m)


@pytest.mark.parametrize("alignment", ODD_ALIGNMENTS)
@pytest.mark.parametrize("psum", [False, True])
@pytest.mark.parametrize("form", ["sm90", "sm100"])
def test_fp8_contiguous_any_alignment(form, psum, alignment):
    _check_fp8_contiguous(form, psum, ODD_COUNTS, alignment, n=24, k=160, seed=11)


@pytest.mark.parametrize("config", grouped_contiguous.CONFIGS, ids=_config_id)
@pytest.mark.parametrize("psum", [False, True])
def test_bf16_contiguous_alignment_224_every_config(psum, config):
    alignment, n, k = 224, 40, 64
    m_indices, layout = _contiguous_case(ODD_COUNTS, alignment, psum)
    m = m_indices.numel()
    a = randn(m, k, seed=13, dtype=torch.bfloat16)
    b = randn(len(ODD_COUNTS), n, k, seed=14, dtype=torch.bfloat16)
    d = poison(m, n, dtype=torch.bfloat16)
    grouped_contiguous.m_grouped_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=psum, alignment=alignment,
                                                    config=config)
    valid = m_indices >= 0
    assert torch.isnan(d[~valid].float()).all()
    ref = grouped_gemm_contiguous_reference(a.double(), b.double(), m_indices)
    assert calc_diff(d[valid], ref[valid]) < 1e-5


def test_contiguous_skips_out_of_range_groups_beside_valid_ones():
    """Ids >= G or below -1 in a tile holding a valid group: only the valid group's rows are written."""
    a = randn(64, 32, seed=5, dtype=torch.bfloat16)
    b = randn(2, 16, 32, seed=6, dtype=torch.bfloat16)
    ids = torch.tensor([1] * 10 + [5] * 20 + [-3] * 4 + [0] * 30, dtype=torch.int32)
    d = poison(64, 16, dtype=torch.float32)
    grouped_contiguous.m_grouped_gemm_nt_contiguous(a, b, d, ids, alignment=1)
    valid = (ids >= 0) & (ids < 2)
    assert torch.isnan(d[~valid]).all()
    ref = grouped_gemm_contiguous_reference(a.double(), b.double(), torch.where(valid, ids, -1))
    assert calc_diff(d[valid], ref[valid]) < 1e-5


@pytest.mark.parametrize("alignment", [0, -64, True, 64.0])
def test_contiguous_refuses_an_alignment_that_is_not_a_positive_int(alignment):
    a = randn(4, 32, seed=5, dtype=torch.bfloat16)
    b = randn(1, 16, 32, seed=6, dtype=torch.bfloat16)
    with pytest.raises(ContractError, match="alignment"):
        grouped_contiguous.m_grouped_gemm_nt_contiguous(a, b, torch.empty(4, 16), torch.zeros(4, dtype=torch.int32),
                                                        alignment=alignment)


@pytest.mark.parametrize("form", FORMS)
def test_fp8_masked(form):
    g, max_m, n, k = 3, 70, 40, 160
    masked_m = torch.tensor([0, 70, 17], dtype=torch.int32)
    ue8m0 = form == "sm100"
    qa = quantized((g, max_m, k), (1, 128), ue8m0, seed=7)
    qb = quantized((g, n, k), (128, 128), ue8m0, seed=8, scale=k ** -0.5)
    sfa, ga = storage(qa, form)
    sfb, gb = storage(qb, form)
    d = poison(g, max_m, n, dtype=torch.float32)
    grouped_masked.m_grouped_gemm_nt_masked(qa.data, qb.data, d, masked_m, 32, sfa=sfa, sfb=sfb, gran_a=ga, gran_b=gb)
    rows = torch.arange(max_m)[None, :] < masked_m[:, None]
    ref = grouped_gemm_masked_reference(dequantized(qa), dequantized(qb))
    assert torch.isnan(d[~rows]).all()
    assert calc_diff(d[rows], ref[rows]) < 1e-9


@pytest.mark.parametrize("config", grouped_masked.CONFIGS[2:], ids=lambda c: "x".join(map(str, c.kwargs.values())))
def test_bf16_masked_clamps_counts(config):
    g, max_m, n, k = 2, 20, 33, 64
    masked_m = torch.tensor([25, 3], dtype=torch.int32)  # 25 > max_m: clamped, never out of bounds
    a = randn(g, max_m, k, seed=9, dtype=torch.bfloat16)
    b = randn(g, n, k, seed=10, dtype=torch.bfloat16)
    d = poison(g, max_m, n, dtype=torch.bfloat16)
    grouped_masked.m_grouped_gemm_nt_masked(a, b, d, masked_m, 16, config=config)
    rows = torch.arange(max_m)[None, :] < masked_m.clamp(max=max_m)[:, None]
    assert torch.isnan(d[~rows].float()).all()
    assert calc_diff(d[rows], grouped_gemm_masked_reference(a.double(), b.double())[rows]) < 1e-5
