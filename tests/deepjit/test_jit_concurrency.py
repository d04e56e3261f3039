"""Concurrency: many processes on one key (one compiles, the rest wait and load), killed builders and
lock holders, and single-flight threads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import ADD_SOURCE, entries, leftovers

import deepjit
from deepjit import cache, locks, maintenance

WORKER = Path(__file__).with_name("jit_worker.py")
PROCESSES = 8
WAIT_S = 120


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.01)


def _start_worker(barrier: Path, index: int, offset: int = 0, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(barrier), str(index), str(offset)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen,
    )


def test_eight_processes_behind_a_barrier_all_succeed_with_one_entry(tmp_path, cache_root):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    workers = [_start_worker(barrier, i) for i in range(PROCESSES)]
    _wait_for(lambda: len(list(barrier.glob("ready.*"))) == PROCESSES, "workers to be ready")
    (barrier / "go").touch()
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=WAIT_S)
        assert worker.returncode == 0, err
        results.append(json.loads(out))
    assert {r["sum"] for r in results} == {5}
    assert len({r["path"] for r in results}) == 1
    assert any(r["origin"] == "built" for r in results)
    [entry] = entries(cache_root, "race")
    assert cache.entry_problems(entry) is None
    assert leftovers(cache_root) == []


def _run_barrier(tmp_path: Path, **popen) -> list[dict]:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    workers = [_start_worker(barrier, i, **popen) for i in range(PROCESSES)]
    _wait_for(lambda: len(list(barrier.glob("ready.*"))) == PROCESSES, "workers to be ready")
    (barrier / "go").touch()
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=WAIT_S)
        assert worker.returncode == 0, err
        results.append(json.loads(out))
    return results


def test_eight_processes_on_one_key_compile_once_and_the_others_load_it(tmp_path, cache_root, wrapped_gxx):
    wrapped_gxx.set("sleep")  # a 0.5 s compile: every worker asks while the first one builds
    results = _run_barrier(tmp_path)
    assert wrapped_gxx.calls() == 1
    assert sorted(r["origin"] for r in results) == ["built"] + ["disk"] * (PROCESSES - 1)
    assert {r["sum"] for r in results} == {5}
    assert len(entries(cache_root, "race")) == 1 and leftovers(cache_root) == []


def test_sigkilled_lock_holder_releases_the_lock_and_the_waiting_builder_proceeds(tmp_path, cache_root, wrapped_gxx):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    (barrier / "go").touch()
    wrapped_gxx.set("hang")
    holder = _start_worker(barrier, 0, start_new_session=True)
    try:
        _wait_for(lambda: (wrapped_gxx.controls / "started").exists(), "the holder's compiler to start")
        wrapped_gxx.set("hang", on=False)
        waiter = _start_worker(barrier, 1, env={**os.environ, "DEEPJIT_VERBOSE": "1"})
        time.sleep(1.0)
        assert waiter.poll() is None and wrapped_gxx.calls() == 1  # waiting on the lock, not compiling
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the holder and its compiler, mid-build
        holder.communicate(timeout=WAIT_S)
    out, err = waiter.communicate(timeout=WAIT_S)
    assert waiter.returncode == 0, err
    assert "waiting for another process building the same key" in err
    assert json.loads(out)["origin"] == "built" and wrapped_gxx.calls() == 2
    [entry] = entries(cache_root, "race")
    assert cache.entry_problems(entry) is None


def test_gc_removes_unheld_lock_files_only(cache_root):
    jit = deepjit.JitContext()
    held = jit.key("held", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    jit.build("free", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    folder = cache_root / cache.LOCKS_DIR
    with cache.open_root(cache_root, False) as root, locks.key_lock(root, "held", held, False):
        maintenance.gc([cache_root], tmp_max_age_s=0)
        assert [p.name for p in folder.iterdir()] == [f"held.{held}.lock"]
    maintenance.gc([cache_root], tmp_max_age_s=0)
    assert list(folder.iterdir()) == []


def test_builder_killed_mid_build_publishes_nothing_and_a_later_build_succeeds(tmp_path, cache_root, wrapped_gxx):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    (barrier / "go").touch()
    wrapped_gxx.set("hang")
    worker = _start_worker(barrier, 0, start_new_session=True)
    try:
        _wait_for(lambda: (wrapped_gxx.controls / "started").exists(), "the compiler to start")
    finally:
        os.killpg(worker.pid, signal.SIGKILL)  # the builder and its compiler, by process group
        worker.communicate(timeout=WAIT_S)
    assert entries(cache_root) == []
    [abandoned] = leftovers(cache_root)
    wrapped_gxx.set("hang", on=False)
    jit = deepjit.JitContext()
    from jit_worker import SOURCE

    artifact = jit.build("race", SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
    assert artifact.origin == "built"
    assert jit.compile("race", SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0}).add(1, 2) == 3
    assert leftovers(cache_root) == [abandoned]  # young: could still be a live builder
    old = time.time() - 7200
    os.utime(abandoned, (old, old))
    assert [path for path, _ in maintenance.gc([cache_root], tmp_max_age_s=3600).removed] == [abandoned]


def test_threads_on_one_key_share_a_single_build(wrapped_gxx):
    wrapped_gxx.set("sleep")
    jit = deepjit.JitContext()
    threads = 8
    start = threading.Barrier(threads)
    results: list[object] = []
    errors: list[BaseException] = []

    def work() -> None:
        start.wait()
        try:
            results.append(jit.compile("single", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0}))
        except BaseException as exc:  # reported below
            errors.append(exc)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert errors == []
    assert len(results) == threads and all(r is results[0] for r in results)
    assert wrapped_gxx.calls() == 1


def test_threads_waiting_on_a_failed_build_retry_it(wrapped_gxx):
    jit = deepjit.JitContext()
    wrapped_gxx.set("fail")
    outcomes: list[str] = []
    start = threading.Barrier(4)

    def work() -> None:
        start.wait()
        try:
            jit.build("flaky", ADD_SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": 0})
            outcomes.append("ok")
        except deepjit.CompileError:
            outcomes.append("error")

    pool = [threading.Thread(target=work) for _ in range(4)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert outcomes == ["error"] * 4
    assert wrapped_gxx.calls() == 4
