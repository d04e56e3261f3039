"""Ascend toolchain with fake bisheng and ld.lld scripts (no CANN here): commands, publication, load error."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import GXX, entries

import deepjit

KERNEL = '#include "kernel_operator.h"\nextern "C" __global__ __aicore__ void add_custom(GM_ADDR x) {}\n'


@pytest.fixture
def elf_object(tmp_path) -> Path:
    """A real ELF object for the fake compilers to hand out."""
    source = tmp_path / "stub.c"
    source.write_text("int stub;\n")
    obj = tmp_path / "stub.o"
    subprocess.run([GXX, "-c", "-x", "c", str(source), "-o", str(obj)], check=True)
    return obj


@pytest.fixture
def fake_cann(make_script, monkeypatch, tmp_path, elf_object):
    log = tmp_path / "cann.log"
    bisheng = make_script("bisheng", f"""
        [ "$1" = "--version" ] && echo "bisheng version 1.0 (fake)" && exit 0
        echo "bisheng $*" >> {log}
        for last; do :; done
        cp {elf_object} "$last"
        """)
    make_script("ld.lld", f"""
        [ "$1" = "--version" ] && echo "LLD 15.0.5 (fake)" && exit 0
        echo "ld.lld $*" >> {log}
        for last; do :; done
        cp "$4" "$last"
        """)
    monkeypatch.setenv("DEEPJIT_BISHENG", str(bisheng))
    return log


def test_kernel_object_is_compiled_linked_and_published(fake_cann, cache_root):
    artifact = deepjit.JitContext().build("add_custom", KERNEL, toolchain="ascend", arch="dav-c220-vec")
    assert artifact.path.name == "add_custom.o" and artifact.origin == "built"
    compile_line, link_line = fake_cann.read_text().splitlines()
    assert "-x cce" in compile_line and "--cce-aicore-arch=dav-c220-vec" in compile_line
    assert link_line.split()[1:4] == ["-m", "aicorelinux", "-Ttext=0"]
    assert "-static" in link_line
    [entry] = entries(cache_root)
    assert sorted(p.name for p in entry.path.iterdir()) == ["COMMITTED", "add_custom.cpp", "add_custom.o", "manifest.json"]


def test_linker_is_found_next_to_bisheng(fake_cann, tmp_path):
    artifact = deepjit.JitContext().build("add_custom", KERNEL, toolchain="ascend", arch="dav-c220-cube")
    assert artifact.manifest["compilers"]["ld.lld"]["chosen_by"] == "next to bisheng"
    assert "LLD 15.0.5 (fake)" in artifact.manifest["compilers"]["ld.lld"]["version"]


def test_both_tool_versions_are_in_the_key(fake_cann, make_script, monkeypatch):
    before = deepjit.JitContext().key("add_custom", KERNEL, toolchain="ascend", arch="dav-c220-vec")
    other = make_script("other-lld", '[ "$1" = "--version" ] && echo "LLD 16 (fake)"\nexit 0\n')
    monkeypatch.setenv("DEEPJIT_LD_LLD", str(other))
    assert deepjit.JitContext().key("add_custom", KERNEL, toolchain="ascend", arch="dav-c220-vec") != before


def test_failing_link_step_publishes_nothing(fake_cann, make_script, monkeypatch, cache_root):
    broken = make_script("broken-lld", """
        [ "$1" = "--version" ] && echo "LLD (broken)" && exit 0
        echo "ld.lld: error: undefined symbol" >&2
        exit 1
        """)
    monkeypatch.setenv("DEEPJIT_LD_LLD", str(broken))
    with pytest.raises(deepjit.CompileError, match="undefined symbol") as failure:
        deepjit.JitContext().build("add_custom", KERNEL, toolchain="ascend", arch="dav-c220-vec")
    assert failure.value.command[0] == str(broken)
    assert entries(cache_root) == []


@pytest.mark.skipif(shutil.which("npu-smi") is not None, reason="an Ascend runtime may be installed here")
def test_loading_without_the_ascend_runtime_is_a_clear_error(fake_cann):
    with pytest.raises(deepjit.DeviceUnavailableError, match="libascendcl"):
        deepjit.JitContext().compile("add_custom", KERNEL, toolchain="ascend", arch="dav-c220-vec")


def test_missing_bisheng_names_the_variables(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(deepjit.ToolchainNotFoundError, match="PK_JIT_BISHENG or DEEPJIT_BISHENG"):
        deepjit.JitContext("PK_JIT_").key("k", KERNEL, toolchain="ascend", arch="dav-c220-vec")


def test_ascend_needs_an_aicore_arch():
    with pytest.raises(deepjit.InvalidArgumentError, match="dav-c220-vec"):
        deepjit.JitContext().key("k", KERNEL, toolchain="ascend")
