"""Triton is optional at run time: without it (or outside interpreter mode on CPU tensors) the
nvidia backend still answers through its layout oracle, and the Triton providers say why they
declined — never an ImportError. Each case runs in a fresh process (the mode is per process)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

NEEDS_TRITON = False  # the broken-triton case runs without it; the other two need the real package
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

SCRIPT = textwrap.dedent("""
    import torch, portable_kernels as pk
    from portable_kernels.core.dispatch import trace_providers
    from portable_kernels.core.errors import NoKernelError
    x = torch.randn(4, 256)
    w = torch.randn(64, 256)
    with pk.use_backend("nvidia", arch="sm90"):
        a = pk.per_token_cast_to_fp8(x, prepare_for=pk.fp8_gemm_nt)
        b = pk.prepare_inputs(pk.fp8_gemm_nt, b=pk.per_block_cast_to_fp8(w))["b"]
        d = torch.empty(4, 64)
        with trace_providers() as ran:
            pk.fp8_gemm_nt(a, b, d)
    print("RAN", ran[-1][2])
    from portable_kernels.backends.nvidia.kernels import runtime
    print("REASON", runtime.device_reason(torch.device("cpu")))
""")


def _run(env_update: dict, tmp_path, fake_triton: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_update)
    if fake_triton is not None:
        (tmp_path / "triton").mkdir()
        (tmp_path / "triton" / "__init__.py").write_text(fake_triton)
        env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@needs_triton
def test_cpu_tensors_without_interpreter_mode_fall_back_with_the_reason(tmp_path):
    out = _run({}, tmp_path)
    assert "RAN layout-reference" in out and "TRITON_INTERPRET=1" in out


def test_a_broken_triton_is_a_reason_not_an_import_error(tmp_path):
    out = _run({"TRITON_INTERPRET": "1"}, tmp_path, fake_triton="raise ImportError('no backend here')\n")
    assert "RAN layout-reference" in out and "failed to import" in out and "no backend here" in out


@needs_triton
def test_interpreter_mode_runs_the_triton_kernels(tmp_path):
    out = _run({"TRITON_INTERPRET": "1"}, tmp_path)
    assert "RAN triton" in out and "REASON None" in out
