"""A third-party plugin that provides only `topk` and declares no Formats breaks nothing: it is
installed through a real entry point (a dist-info folder on sys.path), and the CLI (demo with an
odd K, conformance, doctor) and the project's own CLI tests run green beside it, in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

PLUGIN = '''
import portable_kernels as pk
from portable_kernels.core.oracle import register_reference
from portable_kernels.ops.topk import TOPK


class Toy(pk.Backend):
    name = "toytopk"
    emulation = True


def register(registry):
    registry.add_backend(Toy())
    register_reference(registry, "toytopk", TOPK, name="toy")
'''


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("toy_site")
    (site / "toy_topk_plugin.py").write_text(PLUGIN)
    info = site / "toy_topk_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-topk-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[portable_kernels.backends]\ntoytopk = toy_topk_plugin:register\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)


def test_partial_plugin_gets_the_plain_format_and_passes_its_one_op(plugin_env):
    probe = ("import portable_kernels as pk; b = pk.registry().backend('toytopk'); "
             "print(b.formats()[0].name, pk.available_backends()['toytopk'].providers)")
    result = _run(plugin_env, "-c", probe)
    assert result.returncode == 0, result.stderr
    assert "fp32-row-major {'topk': ('toy',)}" in result.stdout
    conf = _run(plugin_env, "-m", "portable_kernels", "conformance", "--backend", "toytopk", "--quick")
    assert conf.returncode == 0, conf.stdout + conf.stderr
    assert "toy x" in conf.stdout and "not provided by 'toytopk'" in conf.stdout and "PASS" in conf.stdout


def test_demo_and_doctor_run_with_a_partial_plugin_installed(plugin_env):
    demo = _run(plugin_env, "-m", "portable_kernels", "demo", "--tokens", "8", "--hidden", "256", "--experts", "8",
                "--seqlen", "100", "--repeats", "1")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "toytopk: not run" in demo.stdout and "\ncpu " in demo.stdout
    doctor = _run(plugin_env, "-m", "portable_kernels", "doctor")
    assert doctor.returncode == 0 and "toytopk: devices []" in doctor.stdout


def test_the_cli_tests_pass_with_a_partial_plugin_installed(plugin_env):
    result = _run(plugin_env, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "tools" / "test_cli.py"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
