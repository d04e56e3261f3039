"""Clean-ups racing builds: clear/gc spare live builds, a build folder deleted under the compiler is
retried (or reported as a cleared cache, never as a CompileError), and compile_to_path returns only
the verified build."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest
from conftest import ADD_SOURCE, entries

import deepjit
from deepjit import cache, maintenance

WAIT_S = 120


def _options() -> dict:
    return dict(toolchain="host", kind="ctypes", defines={"OFFSET": 0})


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.01)


def test_clear_and_gc_during_a_build_leave_the_live_build_alone(cache_root, wrapped_gxx):
    wrapped_gxx.set("wait")
    results: list[object] = []
    builder = threading.Thread(target=lambda: results.append(_build_or_error()))
    builder.start()
    try:
        _wait_for(lambda: (wrapped_gxx.controls / "started").exists(), "the compiler to start")
        [live] = list((cache_root / cache.TMP_DIR).iterdir())
        removed = maintenance.clear([cache_root])
        removed += [path for path, _ in maintenance.gc([cache_root], tmp_max_age_s=0).removed]
        assert live not in removed and live.is_dir()
    finally:
        wrapped_gxx.set("continue")
        builder.join(WAIT_S)
    [artifact] = results
    assert isinstance(artifact, deepjit.Artifact) and artifact.origin == "built"
    assert [e.path for e in entries(cache_root)] == [artifact.entry]


def _build_or_error() -> object:
    try:
        return deepjit.JitContext().build("add", ADD_SOURCE, **_options())
    except Exception as exc:  # the test asserts on it
        return exc


def test_build_folder_deleted_under_the_compiler_is_built_again(cache_root, wrapped_gxx):
    wrapped_gxx.set("rmcwd")  # like `rm -rf` of the cache, or a clean-up by an older deepjit
    artifact = deepjit.JitContext().build("add", ADD_SOURCE, **_options())
    assert artifact.origin == "built" and wrapped_gxx.calls() == 2
    assert cache.verify([cache_root]) == [(entries(cache_root)[0], None)]


def test_build_folder_deleted_every_time_says_the_cache_was_cleared(cache_root, wrapped_gxx):
    wrapped_gxx.set("rmcwd_always")
    with pytest.raises(deepjit.CacheError, match="the cache was cleared during the build of 'add'") as failure:
        deepjit.JitContext().build("add", ADD_SOURCE, **_options())
    assert not isinstance(failure.value, (deepjit.CompileError, deepjit.ToolchainNotFoundError, deepjit.LoadError))
    assert entries(cache_root) == []


def test_cache_cleared_between_publication_and_loading_still_loads_the_verified_build(cache_root, monkeypatch):
    real_publish = cache.publish

    def publish_then_clear(*args, **kwargs):
        published = real_publish(*args, **kwargs)
        maintenance.clear([cache_root])
        return published

    monkeypatch.setattr(cache, "publish", publish_then_clear)
    library = deepjit.JitContext().compile("add", ADD_SOURCE, **_options())
    assert library.add(2, 3) == 5
    assert entries(cache_root) == []


def _is_the_verified_build(path) -> bool:
    manifest = json.loads((path.parent / cache.MANIFEST).read_text())
    return hashlib.sha256(path.read_bytes()).hexdigest() == manifest["artifact_sha256"]


def test_compile_to_path_rebuilds_an_artifact_changed_since_it_was_remembered(cache_root):
    jit = deepjit.JitContext()
    first = jit.compile_to_path("add", ADD_SOURCE, **_options())
    first.write_bytes(b"\x7fELF not what was built")
    path = jit.compile_to_path("add", ADD_SOURCE, **_options())
    assert _is_the_verified_build(path)


def test_compile_to_path_rebuilds_an_artifact_cleared_since_it_was_remembered(cache_root):
    jit = deepjit.JitContext()
    jit.compile_to_path("add", ADD_SOURCE, **_options())
    maintenance.clear([cache_root])
    path = jit.compile_to_path("add", ADD_SOURCE, **_options())
    assert path.is_file() and _is_the_verified_build(path)


def test_compile_to_path_never_returns_a_path_cleared_right_after_publication(cache_root, monkeypatch):
    real_publish = cache.publish
    calls = []

    def publish_then_clear_once(*args, **kwargs):
        published = real_publish(*args, **kwargs)
        if not calls:
            calls.append(published)
            maintenance.clear([cache_root])
        return published

    monkeypatch.setattr(cache, "publish", publish_then_clear_once)
    path = deepjit.JitContext().compile_to_path("add", ADD_SOURCE, **_options())
    assert path.is_file() and _is_the_verified_build(path)
