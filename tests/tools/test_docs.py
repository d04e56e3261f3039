"""The docs stay true: architecture.md's snippets run as written, and adding-a-backend.md builds a
working plugin package from an empty folder (its `# file:` blocks), which installs, is discovered
through its entry point, and passes conformance from the CLI and from Python."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
FILE_HEADER = re.compile(r"^# file: (\S+)\n")


def _blocks(name: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", (DOCS / name).read_text(), flags=re.S)


def test_architecture_snippets_run():
    blocks = _blocks("architecture.md", "python")
    assert blocks, "architecture.md has no python snippets"
    namespace = {"__name__": "docs_architecture"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"architecture.md block {i}", "exec"), namespace)


def _write_guide_package(root: Path) -> list[str]:
    """Write every `# file:` block of the guide under root; return the python blocks without a header."""
    files: dict[str, str] = {}
    scripts = []
    for lang in ("toml", "python"):
        for block in _blocks("adding-a-backend.md", lang):
            match = FILE_HEADER.match(block)
            if match is None:
                scripts.append(block)
                continue
            files[match.group(1)] = files.get(match.group(1), "") + block[match.end():] + "\n"
    assert set(files) == {"pyproject.toml", "mychip_backend/__init__.py"}, sorted(files)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return scripts


def test_adding_a_backend_guide_builds_a_plugin_that_passes_conformance(tmp_path):
    source, site = tmp_path / "mychip", tmp_path / "site"
    scripts = _write_guide_package(source)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(source)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300,
                              cwd=tmp_path)

    cli = run("-m", "portable_kernels", "conformance", "--backend", "mychip", "--quick", "--ops", "fp8_gemm_nt",
              "per_token_cast_to_fp8")
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "conformance of backend 'mychip'" in cli.stdout and "PASS" in cli.stdout
    assert "K = 300 is not a multiple of 16" in cli.stdout  # a declared limit shows up as a reason
    doctor = run("-m", "portable_kernels", "doctor")
    assert doctor.returncode == 0 and "mychip-ue8m0-bytes-k-major" in doctor.stdout
    assert "K % 16 == 0" in doctor.stdout
    assert scripts, "the guide shows how to run conformance from Python"
    for script in scripts:
        result = run("-c", script)
        assert result.returncode == 0, result.stdout + result.stderr


def test_porting_snippets_run():
    # the runnable snippets start with "# before: <the upstream import>" (the others quote upstream code)
    blocks = [b for b in _blocks("porting.md", "python") if b.startswith("# before:")]
    assert len(blocks) >= 3, "porting.md should hold a runnable snippet for DeepGEMM, FlashMLA and DeepSelect"
    for i, block in enumerate(blocks):
        exec(compile(block, f"porting.md block {i}", "exec"), {"__name__": f"docs_porting_{i}"})
