"""The host build rule (portable_kernels/core/native/build.py): ISA flags in the build key, threads
from torch, and the fallback — a missing compiler, a failed build or PK_NATIVE=0 give None with the
reason, one warning, and the reference providers keep working."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from portable_kernels.core.native import build

ROOT = Path(__file__).resolve().parents[2]
GOOD = 'extern "C" int pk_test_answer() { return 42; }\n'


def _library(tmp_path: Path, text: str, family: str) -> build.NativeLibrary:
    source = tmp_path / f"{family}.cpp"
    source.write_text(text)
    return build.NativeLibrary(family, source, {"pk_test_answer": []}, returns={"pk_test_answer": build.I32})


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(build, "_warned", False)


def test_a_library_builds_once_and_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("PK_JIT_CACHE_DIR", str(tmp_path / "cache"))
    lib = _library(tmp_path, GOOD, "test_good")
    assert lib.get().pk_test_answer() == 42
    assert lib.get() is lib.get()
    assert lib.status().startswith("ready")


def test_a_failed_build_is_a_reason_and_one_warning(tmp_path, monkeypatch, fresh_warning):
    monkeypatch.setenv("PK_JIT_CACHE_DIR", str(tmp_path / "cache"))
    lib = _library(tmp_path, "this is not C++\n", "test_broken")
    with pytest.warns(RuntimeWarning, match="native C\\+\\+ kernels unavailable"):
        assert lib.get() is None
    assert "test_broken.cpp did not compile" in lib.reason()
    other = _library(tmp_path, "neither is this\n", "test_broken_too")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second failure in the same process stays quiet
        assert other.get() is None
    assert lib.status().startswith("unavailable")


def test_a_missing_compiler_is_a_reason(tmp_path, monkeypatch, fresh_warning):
    monkeypatch.setenv("PK_JIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PK_JIT_CXX", str(tmp_path / "no-such-g++"))
    lib = _library(tmp_path, GOOD, "test_nocxx")
    with pytest.warns(RuntimeWarning):
        assert lib.get() is None
    assert "PK_JIT_CXX" in lib.reason() or "no-such-g++" in lib.reason()


def test_pk_native_0_switches_native_code_off(tmp_path, monkeypatch):
    monkeypatch.setenv("PK_NATIVE", "0")
    lib = _library(tmp_path, GOOD, "test_off")
    assert lib.get() is None
    assert lib.reason() == "disabled by PK_NATIVE=0"


def test_flags_name_the_isa_and_optimise():
    flags = build.compiler_flags("avx2")
    assert {"-O3", "-fopenmp", "-march=x86-64-v3"} <= set(flags)
    assert "-march=x86-64-v4" in build.compiler_flags("avx512")
    assert "-march=armv8-a" in build.compiler_flags("neon")
    assert not any(f.startswith("-march") for f in build.compiler_flags("generic"))


def test_isa_override_cannot_exceed_the_machine(monkeypatch):
    level, _ = build.detected_isa()
    monkeypatch.setenv(build.ISA_ENV, "generic")
    assert build.isa() == "generic"
    if level != "avx512":
        monkeypatch.setenv(build.ISA_ENV, "avx512")
        with pytest.warns(UserWarning, match="not supported"):
            assert build.isa() == level


def test_the_isa_is_part_of_the_build_key(tmp_path):
    source = GOOD
    keys = {build.JIT.key("pk_k", source, toolchain="host", kind="ctypes", flags=build.compiler_flags(level))
            for level in ("avx512", "avx2", "generic")}
    assert len(keys) == 3


def test_threads_follow_torch():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert build.num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_without_native_code_the_reference_providers_run():
    code = ("import torch, warnings; import portable_kernels as pk\n"
            "from portable_kernels.core.dispatch import trace_providers\n"
            "x = torch.randn(4, 256).bfloat16(); w = torch.randn(8, 256).bfloat16()\n"
            "a = pk.per_token_cast_to_fp8(x); b = pk.per_block_cast_to_fp8(w)\n"
            "p = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b); d = torch.empty(4, 8, dtype=torch.bfloat16)\n"
            "with trace_providers() as ran: pk.fp8_gemm_nt(p['a'], p['b'], d)\n"
            "print(ran[-1][2])\n")
    env = {**__import__("os").environ, "PK_NATIVE": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "reference"


def test_the_wheel_ships_every_native_source():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = config["package-data"]
    folders = {"portable_kernels.core.native": (ROOT / "portable_kernels" / "core" / "native", ""),
               "portable_kernels.backends.cpu": (ROOT / "backends" / "cpu" / "kernels", "kernels/")}
    for package, (folder, prefix) in folders.items():
        sources = {p.suffix for p in folder.iterdir() if p.suffix in (".cpp", ".h")}
        assert sources, f"{folder} holds no native sources"
        assert {f"{prefix}*{suffix}" for suffix in sources} <= set(data[package])


_LOWER_ISA_SCRIPT = """
import torch
from portable_kernels.backends.cpu.providers import casts, gemm, topk
from portable_kernels.core.native.build import isa
from portable_kernels.ops.quant.fp8 import dequantize_reference, per_block_cast_to_fp8, per_token_cast_to_fp8
from portable_kernels.ops.quant.fp8 import quantize_blocks_reference
assert isa() == "{isa}", isa()
x = torch.randn(5, 300).bfloat16(); w = torch.randn(33, 300).bfloat16()
a, b = per_token_cast_to_fp8(x), per_block_cast_to_fp8(w)
d = torch.empty(5, 33)
assert gemm.gemm_segments("t", a.data, a.scale, 128, b.data[None], b.scale[None], (128, 128), d, None, None, 300) == "fma"
ref = dequantize_reference(a).double() @ dequantize_reference(b).double().T
assert float(((d.double() - ref) ** 2).sum() / (ref ** 2).sum()) < 1e-12
q, s = casts.cast_fp8(x, (1, 128), False)
wq, ws = quantize_blocks_reference(x, 1, 128, False)
assert torch.equal(s, ws) and torch.equal(q.view(torch.uint8), wq.view(torch.uint8))
s = torch.randn(3, 500)
v, i = topk.topk_native(s, 20)
assert torch.equal(v.sort(1).values, torch.topk(s, 20).values.sort(1).values) and torch.equal(s.gather(1, i), v)
from portable_kernels.backends.cpu.providers import mla
from portable_kernels.ops.attention.decode import MlaDecodeInputs, mla_decode_reference
from portable_kernels.testing.mla_cases import build_paged_cache, check_decode, random_kv
assert mla.engines() == ("fma",), mla.engines()  # no AMX engine below the avx512 build
paged = build_paged_cache(random_kv([300, 77], 1, 576, seed=1), 64, seed=1, fp8=True)
q = torch.randn(2, 1, 20, 576).bfloat16()
out, lse = torch.empty(2, 1, 20, 512, dtype=torch.bfloat16), torch.empty(2, 20, 1)
mla.decode_native(MlaDecodeInputs(q, paged.k_cache, paged.block_table, paged.cache_seqlens, 512, 576 ** -0.5, True,
                                  True, None, None, None, out, lse))
ref_out, ref_lse = mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, 512, 576 ** -0.5,
                                        True, True, None, dtype=torch.float64)
check_decode(out, lse, ref_out, ref_lse)
print("ok")
"""


@pytest.mark.parametrize("level", ["avx2", "generic"])
def test_lower_isa_builds_compute_the_same(level):
    if level == "avx2" and build.detected_isa()[0] not in ("avx512", "avx2"):
        pytest.skip("not an x86 machine with AVX2")
    env = {**__import__("os").environ, build.ISA_ENV: level}
    out = subprocess.run([sys.executable, "-c", _LOWER_ISA_SCRIPT.replace("{isa}", level)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def _lower_levels() -> list[str]:
    level = build.detected_isa()[0]
    x86 = ("avx512", "avx2", "generic")
    return list(x86[x86.index(level) + 1:]) if level in x86 else (["generic"] if level != "generic" else [])


@pytest.mark.parametrize("level", ["avx2", "generic"])
def test_the_cpu_and_op_suites_pass_on_a_lower_isa_build(level):
    """Issue 23: the native providers' own tests and every op's conformance tests, once per ISA build
    this machine executes below its own (the default run covers the detected one)."""
    if level not in _lower_levels():
        pytest.skip(f"{level} is not below this machine's level ({build.detected_isa()[0]})")
    env = {**__import__("os").environ, build.ISA_ENV: level}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(ROOT / "tests" / "backends" / "cpu"),
           str(ROOT / "tests" / "ops"), "--deselect", "tests/backends/cpu/test_native_selftest.py"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout.splitlines()[-1]
