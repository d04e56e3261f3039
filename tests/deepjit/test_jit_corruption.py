"""Corrupt entries: each is reported by verify and stats, listed by ls, removed by gc and rebuilt by a
build, and none makes any of them crash (valid JSON of the wrong shape included)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ADD_SOURCE, entries

import deepjit
from deepjit import cache
from deepjit.cli import main


def _build(jit: deepjit.JitContext | None = None) -> deepjit.Artifact:
    jit = jit or deepjit.JitContext()
    return jit.build("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})


def _manifest_text(text: str | bytes) -> Callable[[Path], None]:
    def corrupt(entry: Path) -> None:
        path = entry / cache.MANIFEST
        path.write_bytes(text if isinstance(text, bytes) else text.encode())

    return corrupt


def _manifest_field(key: str, value: object) -> Callable[[Path], None]:
    def corrupt(entry: Path) -> None:
        path = entry / cache.MANIFEST
        manifest = json.loads(path.read_text())
        manifest[key] = value
        path.write_text(json.dumps(manifest))

    return corrupt


def _without_field(key: str) -> Callable[[Path], None]:
    def corrupt(entry: Path) -> None:
        path = entry / cache.MANIFEST
        manifest = json.loads(path.read_text())
        del manifest[key]
        path.write_text(json.dumps(manifest))

    return corrupt


def _artifact(entry: Path) -> Path:
    return entry / json.loads((entry / cache.MANIFEST).read_text())["artifact"]


def _replace_by_folder(name: str) -> Callable[[Path], None]:
    def corrupt(entry: Path) -> None:
        path = _artifact(entry) if name == "artifact" else entry / name
        path.unlink()
        path.mkdir()

    return corrupt


def _remove(name: str) -> Callable[[Path], None]:
    def corrupt(entry: Path) -> None:
        (_artifact(entry) if name == "artifact" else entry / name).unlink()

    return corrupt


def _truncate_artifact(entry: Path) -> None:
    path = _artifact(entry)
    path.write_bytes(path.read_bytes()[:100])


def _entry_is_a_file(entry: Path) -> None:
    shutil.rmtree(entry)
    entry.write_text("not an entry")


def _marker_text(text: str) -> Callable[[Path], None]:
    def corrupt(entry: Path) -> None:
        (entry / cache.MARKER).write_text(text)

    return corrupt


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "manifest is a JSON list": _manifest_text("[1, 2, 3]"),
    "manifest is JSON null": _manifest_text("null"),
    "manifest is a JSON number": _manifest_text("42"),
    "manifest is a JSON string": _manifest_text('"artifact"'),
    "manifest is an empty object": _manifest_text("{}"),
    "manifest is not JSON": _manifest_text("{"),
    "manifest is empty": _manifest_text(""),
    "manifest is not UTF-8": _manifest_text(b"\xff\xfe\x00garbage"),
    "manifest format missing": _without_field("manifest_format"),
    "manifest format 0": _manifest_field("manifest_format", 0),
    "manifest format 2": _manifest_field("manifest_format", cache.MANIFEST_FORMAT + 1),
    "manifest format as a string": _manifest_field("manifest_format", str(cache.MANIFEST_FORMAT)),
    "manifest format as true": _manifest_field("manifest_format", True),
    "name of another entry": _manifest_field("name", "other"),
    "digest of another entry": _manifest_field("digest", "0" * 64),
    "artifact is a number": _manifest_field("artifact", 123),
    "artifact is null": _manifest_field("artifact", None),
    "artifact is a list": _manifest_field("artifact", ["libadd.so"]),
    "artifact climbs out": _manifest_field("artifact", "../../escape.so"),
    "artifact is absolute": _manifest_field("artifact", "/usr/lib/libc.so.6"),
    "artifact is empty": _manifest_field("artifact", ""),
    "artifact is the manifest": _manifest_field("artifact", cache.MANIFEST),
    "sha256 is a number": _manifest_field("artifact_sha256", 5),
    "sha256 is not hex": _manifest_field("artifact_sha256", "z" * 64),
    "sha256 of other bytes": _manifest_field("artifact_sha256", "ab" * 32),
    "size is a string": _manifest_field("artifact_bytes", "12"),
    "size is negative": _manifest_field("artifact_bytes", -1),
    "size is wrong": _manifest_field("artifact_bytes", 1),
    "toolchain is a number": _manifest_field("toolchain", 5),
    "kind is null": _manifest_field("kind", None),
    "manifest missing": _remove(cache.MANIFEST),
    "manifest is a folder": _replace_by_folder(cache.MANIFEST),
    "marker missing": _remove(cache.MARKER),
    "marker is a folder": _replace_by_folder(cache.MARKER),
    "marker of another build": _marker_text("0" * 64 + " " + "1" * 64 + "\n"),
    "artifact missing": _remove("artifact"),
    "artifact is a folder": _replace_by_folder("artifact"),
    "artifact truncated": _truncate_artifact,
    "entry is a file": _entry_is_a_file,
}


@pytest.fixture(params=sorted(CORRUPTIONS), ids=lambda name: name.replace(" ", "-"))
def corrupt_entry(request, cache_root: Path) -> Path:
    entry = _build().entry
    CORRUPTIONS[request.param](entry)
    return entry


def test_verify_stats_and_ls_report_a_corrupt_entry_without_crashing(corrupt_entry, cache_root, capsys):
    [(entry, problem)] = cache.verify([cache_root])
    assert entry.path == corrupt_entry and isinstance(problem, str) and problem
    assert main(["verify"]) == 1
    assert f"BAD {corrupt_entry}" in capsys.readouterr().out
    assert main(["stats", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["entries"], row["broken"], row["unsafe"]) == (1, 1, 0)
    assert main(["ls", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["path"] == str(corrupt_entry)


def test_a_build_replaces_a_corrupt_entry(corrupt_entry, cache_root):
    jit = deepjit.JitContext()
    assert _build(jit).origin == "built"
    [(entry, problem)] = cache.verify([cache_root])
    assert (entry.path, problem) == (corrupt_entry, None)
    assert jit.compile("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0}).add(2, 3) == 5


def test_gc_removes_a_corrupt_entry(corrupt_entry, cache_root, capsys):
    assert main(["gc"]) == 0
    assert f"removed {corrupt_entry}: " in capsys.readouterr().out
    assert entries(cache_root) == []
    assert not os.path.lexists(corrupt_entry)


def test_manifest_problem_names_what_is_wrong():
    entry = cache.Entry(Path("/r"), Path("/r/add." + "a" * 64), "add", "a" * 64)
    assert "JSON list" in cache.manifest_problem([1], entry)
    assert "format" in cache.manifest_problem({"manifest_format": 99}, entry)
