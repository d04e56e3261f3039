"""The nvidia and ascend plugins: the layouts they declare, their availability reasons, and the
proof that every format carries the same math (identical results to the cpu reference)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import portable_kernels as pk
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.ops.gemm.dense import FP8_GEMM_NT, GemmInputs
from portable_kernels.core.numerics import calc_diff
from portable_kernels.testing.generators import poison, randn

TARGETS = [("cpu", {}), ("nvidia", {"arch": "sm90"}), ("nvidia", {"arch": "sm100"}), ("ascend", {}),
           ("ascend", {"soc": "910b"})]


def _provider_of(call) -> str:
    """Run one op call; the provider that ran it."""
    with trace_providers() as ran:
        call()
    return ran[-1][2]


def _operands(m=3, n=130, k=512, seed=0):
    a = pk.per_token_cast_to_fp8(randn(m, k, seed=seed), use_ue8m0=True)
    b = pk.per_block_cast_to_fp8(randn(n, k, seed=seed + 1, scale=0.05), use_ue8m0=True)
    return a, b


def _prepare(backend, options, a=None, b=None, op=pk.fp8_gemm_nt):
    tensors = {k: v for k, v in (("a", a), ("b", b)) if v is not None}
    return _prepare_for(op, backend, options, **tensors)


def _prepare_for(op, backend, options, **tensors):
    """prepare_inputs with backend options; it takes `arch` itself, other options through use_backend."""
    if set(options) <= {"arch"}:
        return pk.prepare_inputs(op, backend=backend, **tensors, **options)
    with pk.use_backend(backend, **options):
        return pk.prepare_inputs(op, **tensors)


def test_each_backend_tags_its_own_format():
    a, b = _operands()
    formats = {(name, opts.get("arch") or opts.get("soc")): _prepare(name, opts, a, b)["b"].tag.format
               for name, opts in TARGETS}
    assert formats == {("cpu", None): "fp32-row-major",
                       ("nvidia", "sm90"): "sm90-fp32-mn-major-tma",
                       ("nvidia", "sm100"): "sm100-ue8m0-int32-mn-major-tma",
                       ("ascend", None): "ascend-mx-ue8m0-kmajor-pairs",  # Ascend 950 by default in emulation
                       # A2/A3: the exact bf16 values, cast to FRACTAL_NZ at ingest on an NPU (ascend_nz)
                       ("ascend", "910b"): "ascend-dequantized-bf16+npu-nz"}


def test_scale_bytes_differ_as_the_formats_say():
    a, b = _operands(m=3, k=512)
    cpu = _prepare("cpu", {}, a, b)["a"].scale
    sm90 = _prepare("nvidia", {"arch": "sm90"}, a, b)["a"].scale
    sm100 = _prepare("nvidia", {"arch": "sm100"}, a, b)["a"].scale
    ascend = _prepare("ascend", {}, a, b)["a"].scale
    # cpu: fp32 [3, 4] row-major; sm90: same values, MN-major with rows padded to 4
    assert cpu.shape == (3, 4) and cpu.stride() == (4, 1)
    assert sm90.dtype == torch.float32 and sm90.stride() == (1, 4) and torch.equal(sm90, cpu)
    # sm100: one int32 per row holding the four exponent bytes, little-endian
    exps = (cpu.view(torch.int32) >> 23).to(torch.uint8)
    assert sm100.dtype == torch.int32 and sm100.shape == (3, 1) and sm100.stride() == (1, 4)
    assert torch.equal(sm100.flatten().view(torch.uint8).view(3, 4), exps)
    # ascend (950): per-32 exponents as K-major pairs, CANN's x1 scale (m, ceil(k/64), 2), no padding
    assert ascend.dtype == torch.float8_e8m0fnu and ascend.shape == (3, 8, 2) and ascend.is_contiguous()
    assert torch.equal(ascend.view(torch.uint8).reshape(3, 16), exps.repeat_interleave(4, dim=1))


def test_sm100_broadcasts_weight_block_scales_to_rows():
    a, b = _operands(n=130)
    prepared = _prepare("nvidia", {"arch": "sm100"}, a, b)["b"]
    assert prepared.scale.shape == (130, 1) and prepared.storage_granularity == (1, 128)
    assert prepared.granularity == (128, 128)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_every_format_gives_results_identical_to_the_cpu_reference(out_dtype):
    a, b = _operands(m=5, n=130, k=300)
    plain = _prepare("cpu", {}, a, b)
    want = poison(5, 130, dtype=out_dtype)
    FP8_GEMM_NT.kernel(GemmInputs(plain["a"], plain["b"], want))  # the contract's reference kernel
    assert torch.isfinite(want.float()).all()
    for name, options in TARGETS:
        prepared = _prepare(name, options, a, b)
        d = poison(5, 130, dtype=out_dtype)
        provider = _provider_of(lambda: pk.fp8_gemm_nt(prepared["a"], prepared["b"], d))
        if provider == "layout-reference":  # the format decoded to the reference's operands: bit for bit
            assert torch.equal(d, want)
        else:  # a native kernel (cpu "native", nvidia "triton"): the same math in another summation order
            assert calc_diff(d, want) < (1e-9 if out_dtype == torch.float32 else 1e-5)


def test_emulation_needs_an_explicit_choice():
    a, b = _operands()
    d = torch.empty(3, 130)
    pk.fp8_gemm_nt(_prepare("cpu", {}, a, b)["a"], _prepare("cpu", {}, a, b)["b"], d)  # device rule -> cpu
    with pk.use_backend("nvidia", arch="sm100"):
        assert pk.per_token_cast_to_fp8(randn(2, 128, seed=3), use_ue8m0=True, prepare_for=pk.fp8_gemm_nt).tag.backend == "nvidia"


def test_non_power_of_two_scales_are_refused_by_sm100_and_ascend_but_kept_by_sm90():
    b = pk.per_block_cast_to_fp8(randn(128, 256, seed=4))
    assert _prepare("nvidia", {"arch": "sm90"}, None, b)["b"].tag.format.startswith("sm90")
    for name, options in (("nvidia", {"arch": "sm100"}), ("ascend", {})):
        with pytest.raises(pk.LayoutError, match="use_ue8m0=True"):
            pk.prepare_inputs(pk.fp8_gemm_nt, backend=name, b=b, **options)


def test_sm100_bytes_called_as_sm90_are_a_layout_error():
    a, b = _operands()
    prepared = _prepare("nvidia", {"arch": "sm100"}, a, b)
    with pk.use_backend("nvidia", arch="sm90"), pytest.raises(pk.LayoutError, match="sm100"):
        pk.fp8_gemm_nt(prepared["a"], prepared["b"], torch.empty(3, 130))


def test_unknown_arch_is_refused():
    a, b = _operands()
    with pytest.raises(pk.ContractError, match="arch='sm80'.*sm90"):
        _prepare("nvidia", {"arch": "sm80"}, a, b)


def test_nvidia_and_ascend_report_why_they_are_unavailable_here():
    info = pk.available_backends()
    assert info["nvidia"].available == torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert "torch.cuda is not available" in info["nvidia"].reason
    assert not info["ascend"].available and "torch_npu" in info["ascend"].reason
    assert info["nvidia"].emulation and info["ascend"].emulation
    nvidia_fp8 = info["nvidia"].providers["fp8_gemm_nt"]
    assert "triton" in nvidia_fp8 and nvidia_fp8[-1] == "layout-reference"  # the oracle ranks last


def test_nvidia_arch_follows_compute_capability():
    from portable_kernels.backends.nvidia import arch_of_capability
    assert arch_of_capability(9, 0) == "sm90" and arch_of_capability(10, 0) == "sm100"
    assert arch_of_capability(8, 0) is None


def test_ascend_moe_alignment_is_256_and_nvidia_128():
    assert pk.registry().backend("ascend").moe_alignment == 256
    assert pk.registry().backend("nvidia").moe_alignment == 128


def test_a_broken_torch_npu_is_a_reason_not_a_crash(tmp_path):
    fake = tmp_path / "torch_npu"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('libascendcl.so: cannot open shared object file')\n")
    code = ("import portable_kernels as pk; r = pk.available_backends()['ascend'].reason; "
            "assert 'libascendcl' in r, r; print('ok')")
    env = {"PYTHONPATH": str(tmp_path), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def _alignment(name, options):
    with pk.use_backend(name, **options):
        return pk.get_m_alignment_for_contiguous_layout()


def _assert_same_math(results, providers):
    """The layout oracle's results (each format decoded to the reference's operands) agree bit for
    bit; native kernels' (cpu "native", nvidia "triton": other summation orders) agree with them
    within fp32 rounding. Unwritten (NaN-poisoned) elements must be the same everywhere."""
    oracle = [got for got, provider in zip(results, providers) if provider == "layout-reference"]
    want = oracle[0] if oracle else results[0]
    for got, provider in zip(results, providers):
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        if provider == "layout-reference":
            assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
        else:
            assert calc_diff(got.nan_to_num(7.0), want.nan_to_num(7.0)) < 1e-9


def test_grouped_gemms_give_identical_results_on_every_format():
    from portable_kernels.layouts import contiguous_m_indices
    counts, n, k = torch.tensor([5, 0, 70]), 130, 300
    w = pk.per_block_cast_to_fp8(randn(3, n, k, seed=7, scale=0.05), use_ue8m0=True)
    xs = randn(2 * 3, 80, k, seed=8).view(2, 3, 80, k)
    masked_a = pk.per_token_cast_to_fp8(xs[0], use_ue8m0=True)
    masked_m = torch.tensor([80, 0, 33], dtype=torch.int32)
    tokens = randn(int(counts.sum()), k, seed=9)
    contiguous, masked, formats, ran_contiguous, ran_masked = [], [], set(), [], []
    for name, options in TARGETS:
        m_indices = contiguous_m_indices(counts, _alignment(name, options))  # 128 rows, 256 on ascend
        x = torch.zeros(m_indices.numel(), k)  # padding rows of A are zero by contract
        x[m_indices >= 0] = tokens
        prepared = _prepare_for(pk.m_grouped_fp8_gemm_nt_contiguous, name, options, b=w,
                                a=pk.per_token_cast_to_fp8(x, use_ue8m0=True))
        formats.add(prepared["b"].tag.format)
        d = poison(m_indices.numel(), n, dtype=torch.float32)
        ran_contiguous.append(_provider_of(
            lambda: pk.m_grouped_fp8_gemm_nt_contiguous(prepared["a"], prepared["b"], d, m_indices)))
        contiguous.append(d[m_indices >= 0])
        pm = _prepare_for(pk.m_grouped_fp8_gemm_nt_masked, name, options, a=masked_a, b=w)
        dm = poison(3, 80, n, dtype=torch.float32)
        ran_masked.append(_provider_of(lambda: pk.m_grouped_fp8_gemm_nt_masked(pm["a"], pm["b"], dm, masked_m,
                                                                                expected_m=64)))
        masked.append(dm)
    assert {"ascend-mx-ue8m0-kmajor-pairs", "ascend-dequantized-bf16+npu-nz"} <= formats and len(formats) == 5
    assert torch.isfinite(contiguous[0]).all()
    _assert_same_math(contiguous, ran_contiguous)
    _assert_same_math(masked, ran_masked)


def test_fp8_fp4_gemm_gives_identical_results_on_every_format():
    a = pk.per_token_cast_to_fp8(randn(6, 256, seed=10), gran_k=32, use_ue8m0=True)
    b = pk.per_token_cast_to_fp4(randn(70, 256, seed=11))
    results, ran = [], []
    for name, options in TARGETS:
        prepared = _prepare_for(pk.fp8_fp4_gemm_nt, name, options, a=a, b=b)
        d = poison(6, 70, dtype=torch.float32)
        ran.append(_provider_of(lambda: pk.fp8_fp4_gemm_nt(prepared["a"], prepared["b"], d)))
        results.append(d)
    assert torch.isfinite(results[0]).all()
    _assert_same_math(results, ran)
