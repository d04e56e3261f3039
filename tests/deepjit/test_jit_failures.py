"""Failures publish nothing: compiler errors, compilers that lie about success, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ADD_SOURCE, GXX, entries, leftovers

import deepjit
from deepjit import cache


def _build(source: str = ADD_SOURCE, offset: int = 0) -> deepjit.Artifact:
    return deepjit.JitContext().build("add", source, toolchain="host", kind="ctypes", defines={"OFFSET": offset})


def _nothing_published(root: Path) -> bool:
    return entries(root) == [] and leftovers(root) == []


def test_compiler_error_raises_with_command_output_and_kept_source(cache_root):
    broken = 'extern "C" int add(int a, int b) { return a + ; }\n'
    with pytest.raises(deepjit.CompileError) as failure:
        _build(source=broken)
    error = failure.value
    assert error.returncode != 0
    assert "error" in error.output and "add.cpp" in error.output
    assert error.command[0].endswith("g++") and "-o" in error.command
    assert error.source_path.read_text() == broken
    assert error.output in str(error) or len(error.output) > 8000
    assert _nothing_published(cache_root)


def test_failure_is_kept_outside_the_entries_with_its_log(cache_root):
    with pytest.raises(deepjit.CompileError) as failure:
        _build(source="this is not C++\n")
    kept = failure.value.source_path.parent
    assert kept.parent == cache_root / cache.FAILED_DIR
    assert "this is not C++" in (kept / "add.cpp").read_text()
    assert (kept / "compile.log").read_text() == failure.value.output


def test_compile_error_is_a_runtime_error_and_a_deepjit_error():
    with pytest.raises(RuntimeError):
        _build(source="nope\n")
    with pytest.raises(deepjit.DeepJitError):
        _build(source="nope\n")


def test_fake_compiler_exiting_zero_without_output_publishes_nothing(make_script, monkeypatch, cache_root):
    fake = make_script("silent", f'[ "$1" = "--version" ] && exec {GXX} --version\necho "all good"\nexit 0\n')
    monkeypatch.setenv("DEEPJIT_CXX", str(fake))
    with pytest.raises(deepjit.CompileError, match="exited 0 but the compiler produced no output file") as failure:
        _build()
    assert failure.value.returncode == 0 and "all good" in failure.value.output
    assert _nothing_published(cache_root)


def test_fake_compiler_writing_partial_output_publishes_nothing(make_script, monkeypatch, cache_root, tmp_path):
    real = _build().path.read_bytes()
    half = tmp_path / "half.so"
    half.write_bytes(real[: len(real) // 2])
    fake = make_script(
        "partial",
        f'[ "$1" = "--version" ] && exec {GXX} --version\nfor last; do :; done\ncp {half} "$last"\nexit 0\n',
    )
    monkeypatch.setenv("DEEPJIT_CXX", str(fake))
    before = entries(cache_root)
    with pytest.raises(deepjit.CompileError, match="truncated"):
        _build(offset=1)
    assert entries(cache_root) == before and leftovers(cache_root) == []


def test_fake_compiler_writing_garbage_publishes_nothing(make_script, monkeypatch, cache_root):
    fake = make_script(
        "garbage", f'[ "$1" = "--version" ] && exec {GXX} --version\nfor last; do :; done\necho junk > "$last"\n'
    )
    monkeypatch.setenv("DEEPJIT_CXX", str(fake))
    with pytest.raises(deepjit.CompileError, match="not an ELF file"):
        _build()
    assert _nothing_published(cache_root)


def test_failures_are_not_cached_in_process(wrapped_gxx):
    jit = deepjit.JitContext()
    wrapped_gxx.set("fail")
    with pytest.raises(deepjit.CompileError, match="forced failure"):
        jit.build("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    wrapped_gxx.set("fail", on=False)
    assert jit.build("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0}).origin == "built"
    assert wrapped_gxx.calls() == 2


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        (dict(name="bad-name"), "name="),
        (dict(name="has space"), "name="),
        (dict(name=""), "name="),
        (dict(toolchain="rocm"), "toolchain="),
        (dict(kind="wheel"), "kind="),
        (dict(kind="pybind11", name="9lives"), "name="),
        (dict(flags="-O3 -fopenmp"), "flags"),
        (dict(flags=["-O3", 3]), "flags[1]"),
        (dict(defines={"1BAD": 1}), "defines key"),
        (dict(defines={"OK": [1]}), "defines['OK']"),
        (dict(include_dirs="/usr/include"), "include_dirs"),
        (dict(include_dirs=["/definitely/not/here"]), "include_dirs[0]"),
        (dict(arch="sm_90a"), "arch="),
        (dict(source=""), "source"),
    ],
)
def test_bad_input_raises_a_typed_error_naming_the_argument(options, argument, cache_root):
    request = dict(name="add", source=ADD_SOURCE, toolchain="host", kind="ctypes")
    with pytest.raises(deepjit.InvalidArgumentError) as failure:
        deepjit.JitContext().build(**{**request, **options})
    assert isinstance(failure.value, ValueError)
    assert argument in str(failure.value)
    assert not cache_root.exists()


def test_unknown_toolchain_message_lists_the_known_ones():
    with pytest.raises(deepjit.InvalidArgumentError, match=r"\['ascend', 'cuda', 'host'\]"):
        deepjit.JitContext().key("x", "int x;", toolchain="rocm")


def test_missing_compiler_names_the_variable_to_set(monkeypatch, tmp_path):
    monkeypatch.setenv("DEEPJIT_CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(deepjit.ToolchainNotFoundError, match="DEEPJIT_CXX"):
        _build()
