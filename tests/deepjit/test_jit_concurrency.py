"""Concurrency: many processes on one key, killed builders, and single-flight threads."""

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
from deepjit import cache

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
    assert [path for path, _ in cache.gc([cache_root], tmp_max_age_s=3600).removed] == [abandoned]


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
