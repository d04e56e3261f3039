"""Disk cache behaviour: hits and misses, entry layout, integrity, roots, modes and clean-up."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time

import pytest
from conftest import ADD_SOURCE, entries, leftovers

import deepjit
from deepjit import cache


def _build(jit: deepjit.JitContext, offset: int = 0, **options) -> deepjit.Artifact:
    return jit.build("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": offset}, **options)


def test_first_build_misses_then_memory_then_disk_in_a_new_context(jit, cache_root):
    assert _build(jit).origin == "built"
    assert _build(jit).origin == "memory"
    assert _build(deepjit.JitContext()).origin == "disk"


def test_loaded_library_is_called_and_reused_in_process(jit):
    lib = jit.compile("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 10})
    assert lib.add(2, 3) == 15
    assert jit.compile("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 10}) is lib


def test_entry_folder_holds_source_artifact_manifest_and_marker(jit, cache_root):
    artifact = _build(jit)
    entry = cache_root / f"add.{artifact.digest}"
    assert artifact.entry == entry
    assert sorted(p.name for p in entry.iterdir()) == ["COMMITTED", "add.cpp", "libadd.so", "manifest.json"]
    assert (entry / "add.cpp").read_text() == ADD_SOURCE


def test_manifest_records_command_compiler_options_and_artifact_hash(jit, cache_root):
    artifact = _build(jit, 7, flags=["-O1"])
    manifest = json.loads((artifact.entry / "manifest.json").read_text())
    assert manifest["commands"][0][-3:-1] == ["-O1", "-o"]
    assert "g++" in manifest["compilers"]["cxx"]["version"] or "GCC" in manifest["compilers"]["cxx"]["version"]
    assert manifest["options"]["defines"] == {"OFFSET": "7"}
    assert manifest["artifact_sha256"] == hashlib.sha256(artifact.path.read_bytes()).hexdigest()


def test_corrupted_artifact_is_detected_by_hash_and_rebuilt(jit, cache_root):
    artifact = _build(jit)
    data = bytearray(artifact.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    artifact.path.write_bytes(bytes(data))
    [(entry, problem)] = cache.verify([cache_root])
    assert "sha256" in problem
    fresh = deepjit.JitContext()
    rebuilt = fresh.build("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    assert rebuilt.origin == "built"
    assert cache.verify([cache_root]) == [(entry, None)]
    assert fresh.compile("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0}).add(1, 1) == 2


def test_corruption_after_remembering_is_caught_before_loading(jit):
    artifact = _build(jit)
    artifact.path.write_bytes(b"\x7fELF garbage")
    lib = jit.compile("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    assert lib.add(1, 2) == 3


def test_entry_without_commit_marker_is_a_miss(jit, cache_root):
    artifact = _build(jit)
    (artifact.entry / cache.MARKER).unlink()
    assert _build(deepjit.JitContext()).origin == "built"
    assert (artifact.entry / cache.MARKER).is_file()
    assert len(entries(cache_root)) == 1


def test_cache_root_is_created_private(jit, cache_root):
    _build(jit)
    assert stat.S_IMODE(cache_root.stat().st_mode) == 0o700
    assert (cache_root / cache.TAG_FILE).read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")


def test_shared_mode_creates_group_writable_root(jit, cache_root, monkeypatch):
    monkeypatch.setenv("DEEPJIT_CACHE_SHARED", "1")
    artifact = _build(jit)
    assert stat.S_IMODE(cache_root.stat().st_mode) == 0o2775
    assert stat.S_IMODE(artifact.entry.stat().st_mode) & 0o070 == 0o070


def test_hits_come_from_any_root_and_builds_go_to_the_first_writable(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", str(second))
    seeded = _build(deepjit.JitContext())
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", f"{first}{os.pathsep}{second}")
    hit = _build(deepjit.JitContext())
    assert (hit.origin, hit.path) == ("disk", seeded.path)
    assert _build(deepjit.JitContext(), offset=1).entry.parent == first


def test_unwritable_first_root_is_skipped_for_builds(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    second = tmp_path / "second"
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", f"{not_a_dir / 'sub'}{os.pathsep}{second}")
    assert _build(deepjit.JitContext()).entry.parent == second


def test_no_writable_root_raises_cache_error_naming_the_fix(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", str(not_a_dir / "sub"))
    with pytest.raises(deepjit.CacheError, match="DEEPJIT_CACHE_DIR"):
        _build(deepjit.JitContext())


def test_old_temp_folders_of_dead_builders_are_removed_by_the_next_build(jit, cache_root):
    stale = cache_root / cache.TMP_DIR / "add.0123456789abcdef.99999.dead"
    fresh = cache_root / cache.TMP_DIR / "add.0123456789abcdef.99998.live"
    for folder in (stale, fresh):
        folder.mkdir(parents=True)
        (folder / "partial.so").write_bytes(b"\x7fELF")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    _build(jit)
    assert leftovers(cache_root) == [fresh]


def test_disable_cache_builds_without_touching_the_cache_dir(jit, cache_root, monkeypatch):
    monkeypatch.setenv("DEEPJIT_DISABLE_CACHE", "1")
    artifact = _build(jit)
    assert artifact.entry is None and artifact.origin == "built"
    assert not cache_root.exists()
    assert jit.compile("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0}).add(1, 1) == 2


def test_force_rebuild_rebuilds_once_per_process_and_replaces_the_entry(jit, cache_root, monkeypatch):
    first = _build(jit)
    monkeypatch.setenv("DEEPJIT_FORCE_REBUILD", "1")
    forced = _build(deepjit.JitContext())
    assert forced.origin == "built" and forced.digest == first.digest
    assert len(entries(cache_root)) == 1 and leftovers(cache_root) == []
    context = deepjit.JitContext()
    assert [_build(context).origin, _build(context).origin] == ["built", "memory"]


def test_relative_cache_dir_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", "relative-cache")
    artifact = _build(deepjit.JitContext())
    assert artifact.entry.parent == tmp_path / "relative-cache"
