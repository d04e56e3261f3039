"""The cpu backend's native GEMMs (backends/cpu/providers/gemm.py, kernels/gemm.cpp): both engines against the
dequantized reference on odd shapes, exact element conversions, untouched padding rows, argument
checks before any C++ runs, and the providers the registry picks."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.backends.cpu.providers import gemm as ng
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.core.errors import ContractError
from portable_kernels.ops.quant.fp4 import per_token_cast_to_fp4
from portable_kernels.core.numerics import calc_diff
from portable_kernels.ops.quant.fp8 import (QuantTensor, dequantize_reference, per_block_cast_to_fp8,
                                           per_token_cast_to_fp8)
from portable_kernels.testing.generators import poison, randn

from threads import run_interleaved

pytestmark = pytest.mark.skipif(not ng.available(), reason=f"native GEMM unavailable: {ng.LIB.reason()}")

ENGINES = ["fma", pytest.param("amx", marks=pytest.mark.skipif(not ng.amx_available(), reason="no AMX-BF16 here"))]
SHAPES = [(1, 1, 1), (1, 128, 128), (3, 130, 300), (17, 1, 64), (40, 100, 1000), (33, 47, 30), (0, 5, 64), (4, 0, 64)]
#: fp32 output against the fp64 reference of the dequantized operands: only summation order differs
FP32_BOUND = 1e-9


def _fp8_operands(m, n, k, seed, ue8m0):
    x = randn(m, k, seed=seed, dtype=torch.bfloat16)
    w = randn(n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
    return per_token_cast_to_fp8(x, use_ue8m0=ue8m0), per_block_cast_to_fp8(w, use_ue8m0=ue8m0)


def _reference(a, b, c=None):
    out = a.double() @ b.double().T
    return out if c is None else out + c.double()


def _close(d, ref):
    if d.numel() == 0:
        return
    assert bool(torch.isfinite(d).all()), "some output elements were not written"
    assert calc_diff(d, ref) <= FP32_BOUND


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_gemm_matches_the_dequantized_reference(engine, m, n, k, ue8m0):
    a, b = _fp8_operands(m, n, k, seed=10 * m + n + k, ue8m0=ue8m0)
    c = randn(m, n, seed=3)
    d = poison(m, n, dtype=torch.float32)
    ran = ng.gemm_segments("t", a.data, a.scale, 128, b.data[None], b.scale[None], (128, 128), d, c,
                           ng.dense_segments(m), k, engine=engine)
    assert ran == engine
    _close(d, _reference(dequantize_reference(a), dequantize_reference(b), c))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (5, 33, 1000), (40, 100, 96)])
def test_bf16_gemm_accumulates_in_fp32_with_c(engine, m, n, k):
    a = randn(m, k, seed=1, dtype=torch.bfloat16)
    b = randn(n, k, seed=2, dtype=torch.bfloat16)
    c = randn(m, n, seed=3, dtype=torch.bfloat16)
    d = poison(m, n, dtype=torch.float32)
    ng.gemm_segments("t", a, None, 128, b[None], None, (1, 1), d, c, ng.dense_segments(m), k, engine=engine)
    _close(d, _reference(a, b, c))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (3, 130, 300), (40, 100, 1000)])
def test_fp8_fp4_gemm_matches_the_dequantized_reference(engine, pow2, m, n, k):
    x = randn(m, k, seed=4, dtype=torch.bfloat16)
    w = randn(n, k, seed=5, dtype=torch.bfloat16)
    a = per_token_cast_to_fp8(x)
    b = per_token_cast_to_fp4(w, gran_k=32, use_ue8m0=pow2)
    d = poison(m, n, dtype=torch.float32)
    ng.gemm_segments("t", a.data, a.scale, 128, b.data[None], b.scale[None], (1, 32), d, None, ng.dense_segments(m),
                     k, engine=engine, b_pow2=pow2)
    _close(d, _reference(dequantize_reference(a), dequantize_reference(b)))


@pytest.mark.parametrize("engine", ENGINES)
def test_every_fp8_code_converts_exactly_on_both_sides(engine):
    codes = torch.arange(256, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # the two NaN codes
    values = codes.view(torch.float8_e4m3fn)
    eye = torch.eye(256).to(torch.float8_e4m3fn)
    ones_a, ones_b = torch.ones(1, 2), torch.ones(1, 2, 2)
    d = poison(1, 256, dtype=torch.float32)
    ng.gemm_segments("t", values[None], ones_a, 128, eye[None], ones_b, (128, 128), d, None, ng.dense_segments(1), 256,
                     engine=engine)
    assert torch.equal(d[0], values.float())
    one = torch.zeros(1, 256, dtype=torch.uint8)
    one[0, 0] = 0x38  # 1.0
    b = torch.zeros(256, 256, dtype=torch.uint8)
    b[:, 0] = codes
    d = poison(1, 256, dtype=torch.float32)
    ng.gemm_segments("t", one.view(torch.float8_e4m3fn), ones_a, 128, b.view(torch.float8_e4m3fn)[None], ones_b,
                     (128, 128), d, None, ng.dense_segments(1), 256, engine=engine)
    assert torch.equal(d[0], values.float())


@pytest.mark.parametrize("engine", ENGINES)
def test_segments_write_only_their_rows_with_their_group(engine):
    g, n, k = 3, 40, 256
    a, _ = _fp8_operands(20, 1, k, seed=7, ue8m0=False)
    w = randn(g, n, k, seed=8, dtype=torch.bfloat16)
    b = per_block_cast_to_fp8(w)
    segs = torch.tensor([[0, 5, 2], [7, 6, 0], [13, 1, 2]], dtype=torch.int64)  # rows 5, 6, 14..19 are padding
    d = poison(20, n, dtype=torch.bfloat16)
    ng.gemm_segments("t", a.data, a.scale, 128, b.data, b.scale, (128, 128), d, None, segs, k, engine=engine)
    da, db = dequantize_reference(a), dequantize_reference(b)
    for first, rows, group in segs.tolist():
        ref = _reference(da[first:first + rows], db[group])
        assert calc_diff(d[first:first + rows], ref) < 1e-5
    untouched = torch.ones(20, dtype=torch.bool)
    for first, rows, _ in segs.tolist():
        untouched[first:first + rows] = False
    assert bool(torch.isnan(d[untouched].float()).all())


def test_strided_activation_rows_are_read_in_place():
    a, b = _fp8_operands(6, 32, 256, seed=9, ue8m0=False)
    wide = torch.zeros(6, 300, dtype=torch.uint8)
    wide[:, :256] = a.data.view(torch.uint8)
    strided = wide.view(torch.float8_e4m3fn)[:, :256]
    d = poison(6, 32, dtype=torch.float32)
    ng.gemm_segments("t", strided, a.scale, 128, b.data[None], b.scale[None], (128, 128), d, None, ng.dense_segments(6),
                     256)
    _close(d, _reference(dequantize_reference(a), dequantize_reference(b)))


@pytest.mark.parametrize("change,arg", [
    (lambda kw: kw.update(b=kw["b"].transpose(1, 2).contiguous().transpose(1, 2)), "b"),
    (lambda kw: kw.update(sfa=kw["sfa"][:2]), "sfa"),
    (lambda kw: kw.update(d=torch.empty(4, 9)), "d"),
    (lambda kw: kw.update(segments=torch.tensor([[2, 3, 0]])), "segments"),
    (lambda kw: kw.update(segments=torch.tensor([[0, 1, 1]])), "segments"),
    (lambda kw: kw.update(a=kw["a"].float()), "a"),
])
def test_bad_arguments_are_refused_before_native_code_runs(change, arg):
    a, b = _fp8_operands(4, 8, 128, seed=11, ue8m0=False)
    kw = dict(a=a.data, sfa=a.scale, b=b.data[None], sfb=b.scale[None], d=torch.empty(4, 8),
              segments=ng.dense_segments(4))
    change(kw)
    with pytest.raises(ContractError, match=f"'{arg}'"):
        ng.gemm_segments("t", kw["a"], kw["sfa"], 128, kw["b"], kw["sfb"], (128, 128), kw["d"], None, kw["segments"],
                         128)


def test_segments_of_a_row_group_map_are_its_runs():
    groups = torch.tensor([1, 1, -1, 0, 0, 0, 1, -1, -1], dtype=torch.int32)
    assert ng.contiguous_segments(groups).tolist() == [[0, 2, 1], [3, 3, 0], [6, 1, 1]]
    assert ng.masked_segments(torch.tensor([2, 0, 5], dtype=torch.int32), 4).tolist() == [[0, 2, 0], [8, 4, 2]]


@pytest.mark.parametrize("m", [1, 64])
def test_public_gemm_ops_run_the_native_provider(m):
    a, b = _fp8_operands(m, 96, 512, seed=12, ue8m0=False)
    prepared = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
    d = poison(m, 96, dtype=torch.bfloat16)
    with trace_providers() as ran:
        pk.fp8_gemm_nt(prepared["a"], prepared["b"], d)
        x, w = randn(m, 512, seed=1, dtype=torch.bfloat16), randn(96, 512, seed=2, dtype=torch.bfloat16)
        pk.bf16_gemm_nt(x, w, torch.empty(m, 96, dtype=torch.bfloat16))
        pk.bf16_gemm_nt(x, w, torch.empty(m, 96), c=torch.zeros(m, 96))
    first = "torch-blas" if ng.torch_bf16_has_hardware() else "native"  # the per-ISA order, tested below
    assert ran == [("fp8_gemm_nt", "cpu", "native"), ("bf16_gemm_nt", "cpu", first),
                   ("bf16_gemm_nt", "cpu", "native")]
    assert calc_diff(d, _reference(dequantize_reference(a), dequantize_reference(b))) < 1e-5


@pytest.mark.parametrize("level, extras, onednn, blas_first", [
    ("avx512", {"amx", "avx512bf16"}, "", True),          # Sapphire Rapids: oneDNN's AMX bf16 matmul
    ("avx512", {"avx512bf16"}, "", True),
    ("avx512", set(), "", False),                          # Skylake-X: AVX-512 without bf16
    ("avx2", set(), "", False),                            # AMD Zen 3, older Intel
    ("avx512", {"amx", "avx512bf16"}, "AVX2", False),      # oneDNN told to stay on AVX2
    ("neon", set(), "", False),
])
def test_torch_blas_goes_first_only_where_torch_has_bf16_hardware(monkeypatch, level, extras, onednn, blas_first):
    from portable_kernels.core.native import build
    monkeypatch.setattr(build, "detected_isa", lambda: (level, frozenset(extras)))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn)
    assert ng.torch_bf16_has_hardware() is blas_first
    assert (ng.blas_priority() > ng.PRIORITY) is blas_first


def test_registered_bf16_gemm_order_is_the_per_isa_one():
    from portable_kernels.core.registry import registry
    prio = {p.name: p.priority for p in registry().providers("bf16_gemm_nt", "cpu")}
    assert prio["torch-blas"] == ng.blas_priority() and prio["native"] == ng.PRIORITY


def test_bf16_gemm_with_c_reads_mn_major_operands_as_the_wgrad_passes_them():
    a = randn(256, 64, seed=3, dtype=torch.bfloat16).T    # [M, K] views of K-major storage [K, M]
    b = randn(256, 96, seed=4, dtype=torch.bfloat16).T
    c = randn(64, 96, seed=5)
    d = poison(64, 96, dtype=torch.float32)
    with trace_providers() as ran:
        pk.bf16_gemm_nt(a, b, d, c=c)
    assert ran == [("bf16_gemm_nt", "cpu", "native")]
    assert calc_diff(d, c + a.float() @ b.float().T) < 1e-10


# -- per-call latency paths: register dequantization, serial small calls, the packed call --------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    """The output's bits, every NaN as one canonical NaN (a NaN's sign and payload depend on which
    operand of an FMA the compiler reads first; they carry no value)."""
    t = torch.where(torch.isnan(t), torch.tensor(float("nan"), dtype=t.dtype), t)
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def cdiv(x, y):
    return -(-x // y)


#: fp32 scales the fp8 dequantization must apply exactly: ordinary, negative, subnormal, zero, and
#: ones whose 2^8 multiple overflows (the fused multiply then cannot be used)
ODD_SCALES = [0.37, -1.5, 1.2e-40, 0.0, 3.0e37, -2.9e38, 2.0 ** -126]


def _odd_scaled(n, k, gran, seed, scales=ODD_SCALES, nonfinite=False):
    """fp8 B [n, k] with codes of magnitude <= 1 (so v * any finite scale above stays finite) and
    block scales cycling through `scales` (plus inf and NaN when nonfinite)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8)
    codes = (codes & 0x80) | (codes & 0x7F).clamp(max=0x38)  # |v| <= 1, no NaN code
    b = codes.view(torch.float8_e4m3fn)
    pool = list(scales) + ([float("inf"), float("nan")] if nonfinite else [])
    sfb = torch.tensor(pool, dtype=torch.float32)[torch.arange(cdiv(n, gran[0]) * cdiv(k, gran[1])) % len(pool)]
    return b, sfb.reshape(cdiv(n, gran[0]), cdiv(k, gran[1]))


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n,k", [(1, 16), (7, 100), (64, 256), (130, 1000), (33, 2100)])
@pytest.mark.parametrize("b_gran", [(128, 128), (1, 128), (1, 32)])
def test_fp8_register_path_gives_the_tile_paths_bytes(m, n, k, b_gran):
    a, _ = _fp8_operands(m, 1, k, seed=m + k, ue8m0=False)
    b, sfb = _odd_scaled(n, k, b_gran, seed=n + k, nonfinite=True)
    c = randn(m, n, seed=4)
    for out in (torch.float32, torch.bfloat16):
        d_reg, d_tile = poison(m, n, dtype=out), poison(m, n, dtype=out)
        for d, tile in ((d_reg, False), (d_tile, True)):
            ng.gemm_segments("t", a.data, a.scale, 128, b[None], sfb[None], b_gran, d, c, None, k, engine="fma",
                             fma_tile=tile)
        assert torch.equal(_bits(d_reg), _bits(d_tile))


@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("n,k", [(5, 30), (64, 512), (17, 1031)])
def test_bf16_register_path_gives_the_tile_paths_bytes(m, n, k):
    a = randn(m, k, seed=1, dtype=torch.bfloat16)
    b = randn(n, k, seed=2, dtype=torch.bfloat16)
    d_reg, d_tile = poison(m, n, dtype=torch.float32), poison(m, n, dtype=torch.float32)
    for d, tile in ((d_reg, False), (d_tile, True)):
        ng.gemm_segments("t", a, None, 128, b[None], None, (1, 1), d, None, None, k, engine="fma", fma_tile=tile)
    assert torch.equal(_bits(d_reg), _bits(d_tile))
    _close(d_reg, _reference(a, b))


@pytest.mark.parametrize("tile,one_segment", [(False, False), (True, False), (False, True)],
                         ids=["register path", "tile path", "panel path"])
def test_fp8_dequantization_is_the_references_for_any_finite_scale(tile, one_segment):
    # one-hot rows of A pick single elements of B: D[i, n] is B's dequantized value, which must be
    # the reference's v * sf bit for bit, also where sf * 2^8 overflows (the two-multiply fallback);
    # 1-row segments run the register or tile path, one 7-row segment the panel path (> 4 rows)
    k, n = 256, 40
    b, sfb = _odd_scaled(n, k, (1, 128), seed=5)
    ref = dequantize_reference(QuantTensor(b, sfb, (1, 128)))
    picks = torch.tensor([0, 1, 17, 127, 128, 200, 255])
    a = torch.zeros(len(picks), k)
    a[torch.arange(len(picks)), picks] = 1.0
    a = a.to(torch.float8_e4m3fn)
    segs = torch.tensor([[0, len(picks), 0]] if one_segment else [[i, 1, 0] for i in range(len(picks))],
                        dtype=torch.int64)
    d = poison(len(picks), n, dtype=torch.float32)
    ng.gemm_segments("t", a, torch.ones(len(picks), 2), 128, b[None], sfb[None], (1, 128), d, None, segs, k,
                     engine="fma", fma_tile=tile)
    assert torch.equal(d, ref[:, picks].T)


def test_small_calls_on_the_calling_thread_match_the_threaded_run():
    # M*N*K above the serial threshold runs on the worker threads at 2 threads; at 1 thread it runs
    # without one (the small-call path): the bytes must not depend on which
    m, n, k = 2, 1100, 2048
    a, b = _fp8_operands(m, n, k, seed=6, ue8m0=False)
    outs = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for tile in (False, True):
                d = poison(m, n, dtype=torch.float32)
                ng.gemm_segments("t", a.data, a.scale, 128, b.data[None], b.scale[None], (128, 128), d, None, None,
                                 k, engine="fma", fma_tile=tile)
                outs.append(d)
    finally:
        torch.set_num_threads(before)
    for d in outs[1:]:
        assert torch.equal(_bits(d), _bits(outs[0]))
    _close(outs[0], _reference(dequantize_reference(a), dequantize_reference(b)))


def test_dense_entry_checks_like_the_segments_one():
    a, b = _fp8_operands(3, 8, 128, seed=13, ue8m0=False)
    d = poison(3, 8, dtype=torch.float32)
    assert ng.gemm_dense("t", a.data, a.scale, 128, b.data, b.scale, (128, 128), d, None, 128) in ("fma", "amx")
    _close(d, _reference(dequantize_reference(a), dequantize_reference(b)))
    with pytest.raises(ContractError, match="'b'"):
        ng.gemm_dense("t", a.data, a.scale, 128, b.data[None], b.scale, (128, 128), d, None, 128)
    with pytest.raises(ContractError, match="'sfb'"):
        ng.gemm_dense("t", a.data, a.scale, 128, b.data, b.scale[None], (128, 128), d, None, 128)
    with pytest.raises(ContractError, match="'a'"):
        ng.gemm_dense("t", a.data.to("meta"), a.scale, 128, b.data, b.scale, (128, 128), d, None, 128)


def test_the_packed_call_matches_the_library():
    assert ng.LIB.get().pk_gemm_call_size() == ng._CALL.size


def test_concurrent_calls_from_python_threads_each_get_their_own_arguments():
    problems = [_fp8_operands(m, n, 256, seed=m * n, ue8m0=False) for m, n in ((1, 64), (3, 40), (2, 96), (4, 8))]
    expected = []
    for a, b in problems:
        d = torch.empty(a.data.shape[0], b.data.shape[0])
        ng.gemm_dense("t", a.data, a.scale, 128, b.data, b.scale, (128, 128), d, None, 256, engine="fma")
        expected.append(d)
    errors = []

    def work(i):
        a, b = problems[i]
        for _ in range(1000):
            d = poison(a.data.shape[0], b.data.shape[0], dtype=torch.float32)
            ng.gemm_dense("t", a.data, a.scale, 128, b.data, b.scale, (128, 128), d, None, 256, engine="fma")
            if not torch.equal(d, expected[i]):
                errors.append(i)
                return

    run_interleaved(work, len(problems))
    assert errors == []


@pytest.mark.parametrize("a_gran,b_gran", [(0, (128, 128)), (128, (128, 0)), (-1, (128, 128))])
def test_granularities_below_one_are_refused_before_scales_are_sized_from_them(a_gran, b_gran):
    a, b = _fp8_operands(2, 8, 128, seed=14, ue8m0=False)
    with pytest.raises(ContractError, match="granularity"):
        ng.gemm_dense("t", a.data, a.scale, a_gran, b.data, b.scale, b_gran, torch.empty(2, 8), None, 128)


X86 = ("avx512", "avx2", "generic")
#: odd block scales (negative, subnormal, zero) whose products with |v| <= 1 keep every sum finite
FINITE_SUMS = [0.37, -1.5, 1.2e-40, 0.0, 2.0 ** -126, 3.1e-3]


def _use_isa(monkeypatch, level: str) -> None:
    """Build and load the gemm library for `level` for this test (the detected build comes back after)."""
    from portable_kernels.core.native.build import ISA_ENV, detected_isa
    detected = detected_isa()[0]
    if level != detected and not (detected in X86 and level in X86 and X86.index(level) > X86.index(detected)):
        pytest.skip(f"this machine ({detected}) cannot execute a {level} build")
    monkeypatch.setenv(ISA_ENV, level)
    monkeypatch.setattr(ng.LIB, "_lib", None)
    monkeypatch.setattr(ng.LIB, "_tried_isa", None)
    assert ng.LIB.get() is not None, ng.LIB.reason()


def _panel_path_outputs():
    """Segments of more than 4 rows (the panel path) with odd M, N and K tails: fp8 B at two
    granularities, bf16 B, e2m1 B; fp32 and bf16 d, with and without c."""
    outs = []
    for m, n, k, b_gran in ((13, 70, 1000, (128, 128)), (7, 33, 300, (1, 32)), (30, 130, 2100, (128, 128))):
        a, _ = _fp8_operands(m, 1, k, seed=m + k, ue8m0=False)
        b, sfb = _odd_scaled(n, k, b_gran, seed=n + k, scales=FINITE_SUMS)
        for out, c in ((torch.float32, randn(m, n, seed=4)), (torch.bfloat16, None)):
            d = poison(m, n, dtype=out)
            ng.gemm_segments("t", a.data, a.scale, 128, b[None], sfb[None], b_gran, d, c, None, k, engine="fma")
            outs.append(d)
    a16, b16 = randn(9, 515, seed=1, dtype=torch.bfloat16), randn(21, 515, seed=2, dtype=torch.bfloat16)
    d = poison(9, 21, dtype=torch.float32)
    ng.gemm_segments("t", a16, None, 128, b16[None], None, (1, 1), d, None, None, 515, engine="fma")
    outs.append(d)
    a8 = per_token_cast_to_fp8(randn(11, 320, seed=7, dtype=torch.bfloat16))
    b4 = per_token_cast_to_fp4(randn(40, 320, seed=8, dtype=torch.bfloat16), gran_k=32, use_ue8m0=False)
    d = poison(11, 40, dtype=torch.float32)
    ng.gemm_segments("t", a8.data, a8.scale, 128, b4.data[None], b4.scale[None], (1, 32), d, None, None, 320,
                     engine="fma")
    outs.append(d)
    return outs


def test_panel_path_gives_the_same_bytes_on_the_avx512_and_avx2_builds(monkeypatch):
    # each output is one FMA chain over K in order, with no horizontal sum: the vector width must not
    # change a bit (the dot-product paths of <= 4 rows do not promise this)
    from portable_kernels.core.native.build import detected_isa
    if detected_isa()[0] != "avx512":
        pytest.skip("needs a machine that executes both the AVX-512 and the AVX2 build")
    _use_isa(monkeypatch, "avx512")
    wide = _panel_path_outputs()
    _use_isa(monkeypatch, "avx2")
    narrow = _panel_path_outputs()
    for w, n in zip(wide, narrow):
        assert torch.equal(_bits(w), _bits(n))


def test_panel_path_on_the_generic_build_agrees_within_the_contract_tolerance(monkeypatch):
    fma = _panel_path_outputs()
    _use_isa(monkeypatch, "generic")
    for f, g in zip(fma, _panel_path_outputs()):
        assert bool(torch.isfinite(g).all()), "some output elements were not written"
        assert calc_diff(f.double(), g.double()) < 1e-9
