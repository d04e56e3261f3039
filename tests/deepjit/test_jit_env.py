"""Environment knobs: library prefix before DEEPJIT_, before defaults; parsing; printing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import ADD_SOURCE, GXX

import deepjit
from deepjit.env import Environment, default_cache_dir
from deepjit.toolchains import get_toolchain


def test_library_prefix_beats_deepjit_which_beats_the_context_default(monkeypatch, tmp_path):
    monkeypatch.delenv("DEEPJIT_CACHE_DIR")
    context = deepjit.JitContext("PK_JIT_", default_cache_dir=tmp_path / "default")
    assert context.settings().cache_roots == (tmp_path / "default",)
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", str(tmp_path / "deepjit"))
    assert context.settings().cache_roots == (tmp_path / "deepjit",)
    monkeypatch.setenv("PK_JIT_CACHE_DIR", str(tmp_path / "pk"))
    assert context.settings().cache_roots == (tmp_path / "pk",)


def test_default_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "deepjit"
    monkeypatch.delenv("DEEPJIT_CACHE_DIR")
    assert deepjit.JitContext().settings().cache_roots == (tmp_path / "deepjit",)


def test_other_library_prefixes_are_ignored(monkeypatch, tmp_path):
    monkeypatch.setenv("OTHER_JIT_CACHE_DIR", str(tmp_path / "other"))
    assert deepjit.JitContext("PK_JIT_").settings().cache_roots == (Path(os.environ["DEEPJIT_CACHE_DIR"]),)


def test_several_roots_are_split_on_the_path_separator(monkeypatch):
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", f"/a{os.pathsep}/b{os.pathsep}")
    assert deepjit.JitContext().settings().cache_roots == (Path("/a"), Path("/b"))


def test_boolean_knobs_prefer_the_library_prefix(monkeypatch):
    monkeypatch.setenv("DEEPJIT_FORCE_REBUILD", "1")
    monkeypatch.setenv("PK_JIT_FORCE_REBUILD", "0")
    assert deepjit.JitContext("PK_JIT_").settings().force_rebuild is False
    assert deepjit.JitContext().settings().force_rebuild is True


def test_empty_variable_counts_as_unset(monkeypatch):
    monkeypatch.setenv("PK_JIT_VERBOSE", "")
    monkeypatch.setenv("DEEPJIT_VERBOSE", "yes")
    assert deepjit.JitContext("PK_JIT_").settings().verbose is True


def test_bad_boolean_names_the_variable(monkeypatch):
    monkeypatch.setenv("PK_JIT_DISABLE_CACHE", "maybe")
    with pytest.raises(deepjit.InvalidArgumentError, match="PK_JIT_DISABLE_CACHE='maybe'"):
        deepjit.JitContext("PK_JIT_").settings()


def test_bad_prefix_is_rejected_with_an_example():
    with pytest.raises(deepjit.InvalidArgumentError, match="env_prefix='PK_JIT_'"):
        deepjit.JitContext("pk-jit")


def test_compiler_path_precedence_prefix_then_deepjit_then_cxx_then_path(monkeypatch, make_script):
    scripts = {name: make_script(name, f'exec {GXX} "$@"\n') for name in ("pk", "dj", "cxx")}
    host = get_toolchain("host")
    env = Environment("PK_JIT_")
    assert host.tools(env)[0].chosen_by == "g++ on PATH"
    monkeypatch.setenv("CXX", str(scripts["cxx"]))
    assert host.tools(env)[0].path == str(scripts["cxx"])
    monkeypatch.setenv("DEEPJIT_CXX", str(scripts["dj"]))
    assert host.tools(env)[0].path == str(scripts["dj"])
    monkeypatch.setenv("PK_JIT_CXX", str(scripts["pk"]))
    assert (host.tools(env)[0].path, host.tools(env)[0].chosen_by) == (str(scripts["pk"]), "PK_JIT_CXX")


def test_nvcc_is_found_through_cuda_home(monkeypatch, make_script, tmp_path):
    nvcc = make_script("nvcc", "exit 0\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert get_toolchain("cuda").tools(Environment())[0].path == str(nvcc)


def test_print_commands_writes_the_command_line_to_stderr(monkeypatch, capfd):
    monkeypatch.setenv("DEEPJIT_PRINT_COMMANDS", "1")
    deepjit.JitContext().build("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    err = capfd.readouterr().err
    assert "deepjit: " in err and "-DOFFSET=0" in err and "g++" in err


def test_verbose_reports_cache_decisions_and_compiler_output(monkeypatch, capfd):
    monkeypatch.setenv("DEEPJIT_VERBOSE", "1")
    noisy = '#warning "hello from the compiler"\n' + ADD_SOURCE
    deepjit.JitContext().build("add", noisy, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    deepjit.JitContext().build("add", noisy, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    err = capfd.readouterr().err
    assert "hello from the compiler" in err and "published" in err and "disk hit" in err


def test_knobs_are_read_at_call_time(monkeypatch, tmp_path):
    context = deepjit.JitContext()
    first = context.build("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", str(tmp_path / "moved"))
    other = context.build("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 1})
    assert other.entry.parent == tmp_path / "moved"
    same_key = context.build("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    assert (same_key.origin, same_key.path) == ("memory", first.path)  # the location is not part of a key
