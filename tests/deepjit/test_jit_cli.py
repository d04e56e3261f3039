"""`python -m deepjit ls | stats | verify | clear | gc | knobs`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from conftest import ADD_SOURCE, entries, leftovers

import deepjit
from deepjit import cache
from deepjit.cli import main


def _build(offset: int = 0, name: str = "add") -> deepjit.Artifact:
    return deepjit.JitContext().build(name, ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": offset})


def test_ls_lists_entries_as_json(capsys):
    artifact = _build()
    assert main(["ls", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["name"], row["digest"], row["toolchain"], row["kind"]) == ("add", artifact.digest, "host", "ctypes")


def test_stats_counts_entries_per_toolchain(capsys):
    _build(0)
    _build(1)
    assert main(["stats", "--json"]) == 0
    [root] = json.loads(capsys.readouterr().out)
    assert (root["entries"], root["by_toolchain"], root["broken"]) == (2, {"host/ctypes": 2}, 0)


def test_verify_passes_on_sound_entries_and_fails_on_corruption(capsys):
    artifact = _build()
    assert main(["verify"]) == 0
    artifact.path.write_bytes(b"tampered")
    assert main(["verify"]) == 1
    assert "sha256" in capsys.readouterr().out


def test_gc_removes_broken_entries_and_old_temp_folders(cache_root, capsys):
    broken = _build(0)
    kept = _build(1)
    (broken.entry / cache.MARKER).unlink()
    stale = cache_root / cache.TMP_DIR / "add.dead"
    stale.mkdir()
    old = time.time() - 7200
    os.utime(stale, (old, old))
    assert main(["gc"]) == 0
    assert [e.path for e in entries(cache_root)] == [kept.entry]
    assert leftovers(cache_root) == []


def test_gc_unused_days_removes_entries_not_used_recently(cache_root):
    artifact = _build()
    old = time.time() - 3 * 86400
    os.utime(artifact.entry / cache.MARKER, (old, old))
    assert main(["gc", "--unused-days", "2", "--dry-run"]) == 0
    assert len(entries(cache_root)) == 1
    assert main(["gc", "--unused-days", "2"]) == 0
    assert entries(cache_root) == []


def test_gc_size_limit_removes_least_recently_used_first(cache_root):
    older, newer = _build(0), _build(1)
    past = time.time() - 1000
    os.utime(older.entry / cache.MARKER, (past, past))
    limit_mib = (newer.path.stat().st_size + 8192) / 2**20
    assert main(["gc", "--max-mib", str(limit_mib)]) == 0
    assert [e.path for e in entries(cache_root)] == [newer.entry]


def test_clear_by_name_keeps_other_names(cache_root):
    _build(name="add")
    other = _build(name="other")
    assert main(["clear", "--name", "add"]) == 0
    assert [e.path for e in entries(cache_root)] == [other.entry]


def test_clear_refuses_a_folder_that_is_not_a_cache(tmp_path, capsys):
    (tmp_path / "precious").mkdir()
    assert main(["--cache-dir", str(tmp_path / "precious"), "clear"]) == 2
    assert "CACHEDIR.TAG" in capsys.readouterr().err


def test_env_prefix_option_reads_library_knobs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PK_JIT_CACHE_DIR", str(tmp_path / "pk"))
    monkeypatch.setenv("PK_JIT_VERBOSE", "1")
    assert main(["--env-prefix", "PK_JIT_", "knobs"]) == 0
    out = capsys.readouterr().out
    assert f"PK_JIT_CACHE_DIR={tmp_path / 'pk'}" in out and "PK_JIT_VERBOSE=1" in out


def test_module_entry_point_runs():
    completed = subprocess.run([sys.executable, "-m", "deepjit", "stats"], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert "0 entries" in completed.stdout
