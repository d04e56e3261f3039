"""Attacks on the disk cache: planted libraries, foreign owners, loose modes and symbolic links are refused.

The tests run as root here, so "another user" is simulated with os.chown to uid 12345. Every
planted library carries a constructor that writes a marker file when it is loaded; a refused
attack must raise UnsafeCacheError with the fix in its message and must never create the marker.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ADD_SOURCE, GXX, entries

import deepjit
from deepjit import cache, toolchains
from deepjit.cli import main

OTHER_UID = 12345
PLANTED_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char* path = getenv("DEEPJIT_TEST_PLANTED_MARKER");
    FILE* out = path ? fopen(path, "w") : NULL;
    if (out) { fputs("planted code ran\n", out); fclose(out); }
}
extern "C" int add(int a, int b) { return 666; }
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="simulating another user's files needs chown (root)")


@pytest.fixture(scope="module")
def planted_library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    folder = tmp_path_factory.mktemp("planted")
    source = folder / "planted.cpp"
    source.write_text(PLANTED_SOURCE)
    subprocess.run([GXX, "-shared", "-fPIC", str(source), "-o", str(folder / "libplanted.so")], check=True)
    return (folder / "libplanted.so").read_bytes()


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "PLANTED_CODE_RAN"
    monkeypatch.setenv("DEEPJIT_TEST_PLANTED_MARKER", str(path))
    yield path


def _request(jit: deepjit.JitContext, method: str = "compile"):
    return getattr(jit, method)("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})


def _plant(entry: Path, library: bytes) -> None:
    """Replace an entry's artifact by `library` and make manifest and marker agree with it (all an
    attacker who can write the folder has to do)."""
    manifest = json.loads((entry / cache.MANIFEST).read_text())
    sha = hashlib.sha256(library).hexdigest()
    (entry / manifest["artifact"]).write_bytes(library)
    manifest.update(artifact_sha256=sha, artifact_bytes=len(library))
    (entry / cache.MANIFEST).write_text(json.dumps(manifest))
    (entry / cache.MARKER).write_text(f"{manifest['digest']} {sha}\n")


def _chown_tree(path: Path, uid: int) -> None:
    os.lchown(path, uid, -1)
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            _chown_tree(child, uid)


@pytest.fixture
def planted_entry(planted_library: bytes) -> Path:
    """A sound entry for the request, then planted: the attack of issue 10."""
    entry = _request(deepjit.JitContext(), "build").entry
    _plant(entry, planted_library)
    return entry


# --- the control: planting works, so every refusal below is the check's doing ---------------------


def test_control_a_planted_entry_that_you_own_is_trusted_and_runs(planted_entry, marker):
    """The same planting, owned by you, is loaded: only your own account can write such an entry,
    and it can run code as you anyway. The refusals below differ from this test in one property."""
    assert _request(deepjit.JitContext()).add(1, 2) == 666
    assert marker.exists()


# --- foreign owners ------------------------------------------------------------------------------


@pytest.mark.parametrize("part", ["entry and files", "entry folder", "artifact", "manifest", "marker"])
def test_entry_owned_by_another_user_is_refused_and_never_run(planted_entry, marker, part):
    artifact = next(p for p in planted_entry.iterdir() if p.suffix == ".so")
    target = {"entry folder": planted_entry, "artifact": artifact, "manifest": planted_entry / cache.MANIFEST,
              "marker": planted_entry / cache.MARKER}.get(part)
    if target is None:
        _chown_tree(planted_entry, OTHER_UID)
    else:
        os.lchown(target, OTHER_UID, -1)
    for method in ("compile", "build", "compile_to_path"):
        with pytest.raises(deepjit.UnsafeCacheError, match=f"owned by uid {OTHER_UID}.*rm -rf"):
            _request(deepjit.JitContext(), method)
    assert not marker.exists()


def test_root_owned_by_another_user_is_refused_with_the_fix(planted_entry, cache_root, marker):
    os.chown(cache_root, OTHER_UID, -1)
    message = f"cache root {cache_root}: it is owned by uid {OTHER_UID}"
    with pytest.raises(deepjit.UnsafeCacheError, match=message) as failure:
        _request(deepjit.JitContext())
    assert "DEEPJIT_CACHE_DIR" in str(failure.value)
    assert not marker.exists()


# --- loose modes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("bits", "fix"), [(0o002, "chmod o-w"), (0o020, "chmod g-w")])
@pytest.mark.parametrize("part", ["root", "entry", "artifact"])
def test_group_or_world_writable_paths_are_refused(planted_entry, cache_root, marker, bits, fix, part):
    artifact = next(p for p in planted_entry.iterdir() if p.suffix == ".so")
    target = {"root": cache_root, "entry": planted_entry, "artifact": artifact}[part]
    target.chmod(stat.S_IMODE(target.stat().st_mode) | bits)
    with pytest.raises(deepjit.UnsafeCacheError, match=f"`{fix} {target}`"):
        _request(deepjit.JitContext())
    assert not marker.exists()


def test_group_writable_message_points_at_shared_mode(cache_root):
    _request(deepjit.JitContext(), "build")
    cache_root.chmod(0o770)
    with pytest.raises(deepjit.UnsafeCacheError, match="DEEPJIT_CACHE_SHARED=1"):
        _request(deepjit.JitContext())


def test_shared_mode_trusts_a_group_writable_root_of_your_group(cache_root, monkeypatch):
    monkeypatch.setenv("DEEPJIT_CACHE_SHARED", "1")
    _request(deepjit.JitContext(), "build")
    assert stat.S_IMODE(cache_root.stat().st_mode) & 0o020
    assert _request(deepjit.JitContext()).add(2, 3) == 5


def test_shared_mode_still_refuses_a_world_writable_root(cache_root, monkeypatch):
    monkeypatch.setenv("DEEPJIT_CACHE_SHARED", "1")
    _request(deepjit.JitContext(), "build")
    cache_root.chmod(0o777)
    with pytest.raises(deepjit.UnsafeCacheError, match="every user can write it"):
        _request(deepjit.JitContext())


# --- symbolic links --------------------------------------------------------------------------------


def test_symlinked_root_of_your_own_is_followed(tmp_path, monkeypatch):
    real = tmp_path / "real-cache"
    link = tmp_path / "link-cache"
    real.mkdir(mode=0o700)
    link.symlink_to(real)
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", str(link))
    assert _request(deepjit.JitContext(), "build").origin == "built"
    assert _request(deepjit.JitContext(), "build").origin == "disk"
    assert len(entries(real)) == 1


@pytest.mark.parametrize("foreign", ["link", "target"])
def test_symlinked_root_belonging_to_another_user_is_refused(tmp_path, monkeypatch, foreign):
    real = tmp_path / "real-cache"
    link = tmp_path / "link-cache"
    real.mkdir(mode=0o700)
    link.symlink_to(real)
    os.lchown(link if foreign == "link" else real, OTHER_UID, -1)
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", str(link))
    with pytest.raises(deepjit.UnsafeCacheError, match=f"uid {OTHER_UID}"):
        _request(deepjit.JitContext(), "build")
    assert list(real.iterdir()) == []


def test_symlinked_entry_folder_is_refused_and_never_run(planted_entry, tmp_path, marker):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(planted_entry, elsewhere)
    planted_entry.symlink_to(elsewhere)
    with pytest.raises(deepjit.UnsafeCacheError, match="symbolic link.*`rm "):
        _request(deepjit.JitContext())
    assert not marker.exists()


@pytest.mark.parametrize("name", ["artifact", cache.MANIFEST, cache.MARKER])
def test_symlinked_file_inside_an_entry_is_refused(planted_entry, tmp_path, marker, name):
    if name == "artifact":
        name = next(p.name for p in planted_entry.iterdir() if p.suffix == ".so")
    outside = tmp_path / f"outside-{name}"
    shutil.move(planted_entry / name, outside)
    (planted_entry / name).symlink_to(outside)
    with pytest.raises(deepjit.UnsafeCacheError, match="symbolic link"):
        _request(deepjit.JitContext())
    assert not marker.exists()


@pytest.mark.parametrize("folder", [cache.TMP_DIR, cache.LOCKS_DIR, cache.COMPILERS_DIR])
def test_symlinked_cache_folder_is_refused_and_nothing_is_written_through_it(cache_root, tmp_path, folder, monkeypatch):
    monkeypatch.setattr(toolchains, "_identities", {})  # so this process consults .compilers/ again
    cache_root.mkdir(mode=0o700)
    target = tmp_path / f"target{folder}"
    target.mkdir()
    (cache_root / folder).symlink_to(target)
    with pytest.raises(deepjit.UnsafeCacheError, match=f"{folder}: it is a symbolic link"):
        _request(deepjit.JitContext(), "build")
    assert list(target.iterdir()) == []


def test_symlinked_lock_file_is_refused(cache_root, tmp_path):
    digest = deepjit.JitContext().key("add", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    (cache_root / cache.LOCKS_DIR).mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (cache_root / cache.LOCKS_DIR / f"add.{digest}.lock").symlink_to(victim)
    with pytest.raises(deepjit.UnsafeCacheError, match="lock file"):
        _request(deepjit.JitContext(), "build")
    assert victim.read_text() == "precious"


# --- what is loaded is what was verified ----------------------------------------------------------------


def test_artifact_swapped_after_verification_is_not_what_gets_loaded(planted_library, marker, monkeypatch, tmp_path):
    _request(deepjit.JitContext(), "build")
    real_lookup = cache.lookup

    def lookup_then_swap(*args, **kwargs):
        hit, saw_bad = real_lookup(*args, **kwargs)
        if hit is not None:  # between the hash check and the load, the file at the path changes
            swapped = tmp_path / "swapped.so"
            swapped.write_bytes(planted_library)
            os.replace(swapped, hit.artifact)
        return hit, saw_bad

    monkeypatch.setattr(cache, "lookup", lookup_then_swap)
    assert _request(deepjit.JitContext()).add(2, 3) == 5
    assert not marker.exists()


def test_fifo_posing_as_a_manifest_is_corrupt_and_does_not_hang(cache_root):
    entry = _request(deepjit.JitContext(), "build").entry
    (entry / cache.MANIFEST).unlink()
    os.mkfifo(entry / cache.MANIFEST)

    def give_up(*_):
        raise TimeoutError("opening the FIFO blocked")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(20)
    try:
        [(_, problem)] = cache.verify([cache_root])
        assert "not a regular file" in problem
        assert _request(deepjit.JitContext(), "build").origin == "built"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --- the CLI on attacked caches ----------------------------------------------------------------


def test_verify_reports_a_planted_entry_and_gc_removes_it_without_running_it(planted_entry, cache_root, marker, capsys):
    _chown_tree(planted_entry, OTHER_UID)
    assert main(["verify"]) == 1
    out = capsys.readouterr().out
    assert f"BAD {planted_entry}: unsafe: " in out and f"uid {OTHER_UID}" in out
    assert main(["stats", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["broken"], row["unsafe"]) == (1, 1)
    assert main(["gc"]) == 0
    assert entries(cache_root) == []
    assert _request(deepjit.JitContext()).add(2, 3) == 5
    assert not marker.exists()


@pytest.mark.parametrize("command", [["gc"], ["clear"], ["verify"]])
def test_cli_refuses_to_touch_a_world_writable_root(cache_root, command, capsys):
    artifact = _request(deepjit.JitContext(), "build")
    cache_root.chmod(0o777)
    assert main(command) == 2
    assert "every user can write it" in capsys.readouterr().err
    assert artifact.path.exists()


def test_stats_reports_an_unsafe_root_instead_of_looking_into_it(cache_root, capsys):
    _request(deepjit.JitContext(), "build")
    os.chown(cache_root, OTHER_UID, -1)
    assert main(["stats"]) == 0
    assert "UNSAFE, not looked into" in capsys.readouterr().out


# --- the attack of issue 10, by a real process of another user ----------------------------------


def test_entry_planted_by_a_real_process_of_another_user_is_refused(planted_library, marker, monkeypatch):
    """uid 12345 (a real process, not a chown) plants a consistent entry while the root is
    world-writable; root's builds refuse the root, and after `chmod o-w` they refuse the entry."""
    base = Path(tempfile.mkdtemp(prefix="deepjit-plant-", dir="/tmp"))  # reachable by the other user
    try:
        os.chmod(base, 0o755)
        cache_root = base / "cache"
        monkeypatch.setenv("DEEPJIT_CACHE_DIR", str(cache_root))
        entry = _request(deepjit.JitContext(), "build").entry
        planted = base / "plant" / entry.name
        shutil.move(entry, planted)
        _plant(planted, planted_library)
        _chmod_tree(base / "plant", 0o755, 0o644)
        cache_root.chmod(0o777)  # the mistake that lets another user in
        subprocess.run(["cp", "-r", str(planted), str(cache_root)], check=True,
                       user=OTHER_UID, group=OTHER_UID, extra_groups=[], cwd="/")
        assert entry.stat().st_uid == OTHER_UID
        with pytest.raises(deepjit.UnsafeCacheError, match=r"every user can write it .*`chmod o-w"):
            _request(deepjit.JitContext())
        cache_root.chmod(0o700)
        with pytest.raises(deepjit.UnsafeCacheError, match=f"owned by uid {OTHER_UID}"):
            _request(deepjit.JitContext())
        assert not marker.exists()
    finally:
        shutil.rmtree(base)


def _chmod_tree(path: Path, dir_mode: int, file_mode: int) -> None:
    for folder, _, files in os.walk(path):
        os.chmod(folder, dir_mode)
        for name in files:
            os.chmod(os.path.join(folder, name), file_mode)
