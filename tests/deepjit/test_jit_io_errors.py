"""The file system saying no (full disk, read-only, I/O error): a CacheIOError naming the path and the fix,
nothing half-published, and a compiler error never hidden behind a failure to keep its log."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest
from conftest import ADD_SOURCE, entries, leftovers

import deepjit
from deepjit import cache
from deepjit.cli import main


def _build(jit: deepjit.JitContext | None = None, source: str = ADD_SOURCE) -> deepjit.Artifact:
    jit = jit or deepjit.JitContext()
    return jit.build("add", source, toolchain="host", kind="ctypes", defines={"OFFSET": 0})


def _under(fd: int, folder: Path) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder))
    except OSError:
        return False


def _fail(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def test_full_disk_while_writing_the_source_is_a_cache_io_error(cache_root, monkeypatch):
    real_write = os.write

    def full_disk(fd, data):
        if _under(fd, cache_root / cache.TMP_DIR):
            raise _fail(errno.ENOSPC)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(deepjit.CacheIOError) as failure:
        _build()
    error = failure.value
    assert error.errno == errno.ENOSPC
    assert re.search(r"cannot write the source .*/\.tmp/add\.[0-9a-f]{64}\.\d+\.[0-9a-f]+/add\.cpp", str(error))
    assert "file system is full" in str(error) and "gc --max-mib" in str(error) and "DEEPJIT_CACHE_DIR" in str(error)
    assert isinstance(error, deepjit.CacheError)
    monkeypatch.setattr(os, "write", real_write)
    assert entries(cache_root) == [] and leftovers(cache_root) == []


def test_full_disk_while_flushing_the_entry_names_the_file(cache_root, monkeypatch):
    real_fsync = os.fsync

    def full_disk(fd):
        if _under(fd, cache_root / cache.TMP_DIR):
            raise _fail(errno.ENOSPC)
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(deepjit.CacheIOError, match=r"cannot flush .*/\.tmp/.*: No space left on device \(ENOSPC\)"):
        _build()
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert entries(cache_root) == [] and leftovers(cache_root) == []


def test_read_only_file_system_when_creating_the_build_folder(cache_root, monkeypatch):
    real_mkdir = os.mkdir

    def read_only(path, *args, **kwargs):
        if path == cache.TMP_DIR:
            raise _fail(errno.EROFS)
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", read_only)
    with pytest.raises(deepjit.CacheIOError, match=r"cannot create a build folder in .*/\.tmp: .*read-only"):
        _build()


def test_io_error_when_publishing_is_a_cache_io_error_and_publishes_nothing(cache_root, monkeypatch):
    real_rename = os.rename

    def broken(src, dst, *args, **kwargs):
        if isinstance(dst, str) and dst.startswith("add."):
            raise _fail(errno.EIO)
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", broken)
    message = r"cannot publish the build as .*/add\.[0-9a-f]{64}: .*\(EIO\); .*check it"
    with pytest.raises(deepjit.CacheIOError, match=message):
        _build()
    monkeypatch.setattr(os, "rename", real_rename)
    assert entries(cache_root) == [] and leftovers(cache_root) == []


def test_no_creatable_root_lists_each_root_with_its_reason(tmp_path, monkeypatch):
    full = tmp_path / "full"
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", str(full))
    real_mkdir = Path.mkdir

    def no_space(self, *args, **kwargs):
        if self == full:
            raise _fail(errno.ENOSPC)
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", no_space)
    message = rf"{full}: cannot create it \(No space left on device\).*DEEPJIT_CACHE_DIR"
    with pytest.raises(deepjit.CacheError, match=message):
        _build()


def test_a_compile_error_is_not_hidden_by_a_full_disk_when_keeping_the_failure(cache_root, monkeypatch):
    real_write = os.write

    def full_disk(fd, data):
        if _under(fd, cache_root / cache.FAILED_DIR):
            raise _fail(errno.ENOSPC)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(deepjit.CompileError) as failure:
        _build(source="this is not C++\n")
    assert failure.value.source_path is None and failure.value.returncode != 0


def test_gc_reports_an_entry_it_cannot_remove_and_goes_on(cache_root, monkeypatch, capsys):
    stuck, other = (_build_named(name) for name in ("stuck", "other"))
    for artifact in (stuck, other):
        (artifact.entry / cache.MARKER).unlink()  # both broken: gc wants to remove both
    real_rename = os.rename

    def refuse(src, dst, *args, **kwargs):
        if isinstance(src, str) and src.startswith("stuck."):
            raise _fail(errno.EACCES)  # as for another user's folder, when not root
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", refuse)
    assert main(["gc"]) == 1
    captured = capsys.readouterr()
    assert f"could not remove {stuck.entry}: cannot remove {stuck.entry}: Permission denied" in captured.err
    assert f"removed {other.entry}" in captured.out
    assert [e.path for e in entries(cache_root)] == [stuck.entry]


def _build_named(name: str) -> deepjit.Artifact:
    return deepjit.JitContext().build(name, ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
