"""Cache keys: every build input changes the key; paths and cache location do not."""

from __future__ import annotations

import pytest
from conftest import ADD_SOURCE, GXX, NVCC

import deepjit

BASE = dict(
    name="keyed",
    source=ADD_SOURCE,
    toolchain="host",
    kind="ctypes",
    flags=["-O1", "-g0"],
    defines={"OFFSET": 1, "MODE": "fast"},
    signature=["v1"],
)

CHANGES = {
    "source": dict(source=ADD_SOURCE + "// another line\n"),
    "flag_order": dict(flags=["-g0", "-O1"]),
    "extra_flag": dict(flags=["-O1", "-g0", "-DX"]),
    "define_value": dict(defines={"OFFSET": 2, "MODE": "fast"}),
    "define_added": dict(defines={"OFFSET": 1, "MODE": "fast", "EXTRA": None}),
    "name": dict(name="keyed2"),
    "kind": dict(kind="pybind11"),
    "signature": dict(signature=["v2"]),
}


def _key(**changes) -> str:
    return deepjit.JitContext().key(**{**BASE, **changes})


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_input_changes_the_key(change):
    assert _key(**CHANGES[change]) != _key()


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_toolchain_changes_the_key():
    host = _key(kind=None, flags=[])
    cuda = _key(toolchain="cuda", kind=None, flags=[], arch="sm_90a")
    assert host != cuda


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_cuda_arch_changes_the_key():
    assert _key(toolchain="cuda", kind="cubin", arch="sm_90a") != _key(toolchain="cuda", kind="cubin", arch="sm_100a")


def test_compiler_version_output_changes_the_key(make_script, monkeypatch):
    baseline = _key()
    other = make_script("other-gxx", f'[ "$1" = "--version" ] && echo "g++ (Other) 99.0" && exit 0\nexec {GXX} "$@"\n')
    monkeypatch.setenv("DEEPJIT_CXX", str(other))
    assert _key() != baseline


def test_compiler_path_does_not_change_the_key(make_script, monkeypatch):
    baseline = _key()
    same = make_script("relocated-gxx", f'exec {GXX} "$@"\n')
    monkeypatch.setenv("DEEPJIT_CXX", str(same))
    assert _key() == baseline


def test_cache_location_does_not_change_the_key(tmp_path, monkeypatch):
    baseline = _key()
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert _key() == baseline


def test_define_order_does_not_change_the_key():
    assert _key(defines={"MODE": "fast", "OFFSET": 1}) == _key()


def test_key_is_the_digest_the_build_publishes_under(cache_root):
    artifact = deepjit.JitContext().build(**BASE)
    assert artifact.digest == _key()
    assert artifact.entry == cache_root / f"keyed.{artifact.digest}"
    assert len(artifact.digest) == 64 and int(artifact.digest, 16) >= 0


def test_relocated_sources_and_cache_hit_the_same_entry(tmp_path, monkeypatch):
    """A wheel moved elsewhere: same header content under another prefix, cache copied along."""
    for prefix in ("install_a", "install_b"):
        include = tmp_path / prefix / "include"
        include.mkdir(parents=True)
        (include / "offset.h").write_text("#define OFFSET 5\n")
    source = '#include "offset.h"\nextern "C" int add(int a, int b) { return a + b + OFFSET; }\n'
    first = deepjit.JitContext().build("moved", source, toolchain="host", kind="ctypes",
                                       include_dirs=[tmp_path / "install_a" / "include"])
    second = deepjit.JitContext().build("moved", source, toolchain="host", kind="ctypes",
                                        include_dirs=[tmp_path / "install_b" / "include"])
    assert (second.origin, second.digest) == ("disk", first.digest)
