"""A third-party backend installed from tests/plugins/ is discovered through its entry point and
checked by the conformance kit (run in a subprocess so this process's registry stays clean)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "pk_example_backend"

PROBE = r"""
import json, torch, portable_kernels as pk
from portable_kernels.testing import run_conformance
info = pk.available_backends()["example"]
w = pk.per_block_cast_to_fp8(torch.randn(64, 256))
prepared = pk.prepare_inputs(pk.fp8_gemm_nt, backend="example", b=w)["b"]
report = run_conformance(backend="example", quick=True,
                         ops=["fp8_gemm_nt", "per_token_cast_to_fp8", "bf16_gemm_nt"])
print(json.dumps({
    "emulation": info.emulation, "providers": sorted(info.providers),
    "tag": str(prepared.tag), "scale_shape": list(prepared.scale.shape),
    "gemm_ok": report.ops["fp8_gemm_nt"].ok, "gemm_passed": report.ops["fp8_gemm_nt"].passed,
    "quant_ok": report.ops["per_token_cast_to_fp8"].ok,
    "bf16_unsupported": len(report.ops["bf16_gemm_nt"].unsupported),
    "bf16_cases": report.ops["bf16_gemm_nt"].cases,
}))
"""


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("plugin_site")
    source = tmp_path_factory.mktemp("plugin_src") / PLUGIN.name
    shutil.copytree(PLUGIN, source)  # build from a copy: pip writes build/ and egg-info beside the source
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True)
    return target


def _run(plugin_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


def test_plugin_is_discovered_and_passes_conformance_for_the_ops_it_provides(plugin_path):
    result = _run(plugin_path, "-c", PROBE)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["emulation"] is True
    assert out["providers"] == ["fp8_gemm_nt", "per_block_cast_to_fp8", "per_token_cast_to_fp8"]
    assert out["tag"].startswith("example:example-fp32-transposed") and out["scale_shape"] == [2, 1]
    assert out["gemm_ok"] and out["gemm_passed"] > 0 and out["quant_ok"]
    assert out["bf16_unsupported"] == out["bf16_cases"] > 0


def test_conformance_cli_reports_the_plugin(plugin_path):
    result = _run(plugin_path, "-m", "portable_kernels", "conformance", "--backend", "example", "--quick",
                  "--ops", "fp8_gemm_nt")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "conformance of backend 'example'" in result.stdout and "PASS" in result.stdout


def test_doctor_lists_the_plugin(plugin_path):
    result = _run(plugin_path, "-m", "portable_kernels", "doctor")
    assert result.returncode == 0 and "example: devices []" in result.stdout
