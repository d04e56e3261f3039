"""The native kernels' own worker threads (portable_kernels/core/native/pk_pool.h), which the fma
GEMM engine, the routing ops, top-k and the indexer run on instead of OpenMP regions: results do
not depend on the thread count, concurrent callers and forked children work, and idle workers
sleep instead of spinning (what made 2-thread calls slower than 1-thread ones on a busy machine)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from portable_kernels.backends.cpu.providers import gemm as ng
from portable_kernels.ops.quant.fp8 import per_block_cast_to_fp8, per_token_cast_to_fp8
from portable_kernels.testing.generators import poison, randn

from threads import run_interleaved

pytestmark = pytest.mark.skipif(not ng.available(), reason="native cpu GEMM unavailable here")


def _operands(m: int, seed: int = 0):
    """fp8 x fp8 [m, 1024] x [640, 1024]^T (many tasks: 640 columns; rows > 4 take the panel path,
    rows <= 4 the register path)."""
    a = per_token_cast_to_fp8(randn(m, 1024, seed=seed, dtype=torch.bfloat16))
    b = per_block_cast_to_fp8(randn(640, 1024, seed=seed + 1, dtype=torch.bfloat16, scale=1024 ** -0.5))
    return a, b


def _run(a, b, threads: int) -> torch.Tensor:
    d = poison(a.data.shape[0], 640, dtype=torch.float32)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ng.gemm_dense("t", a.data, a.scale, 128, b.data, b.scale, (128, 128), d, None, 1024)
    finally:
        torch.set_num_threads(before)
    return d


def _gemm(m: int, threads: int, seed: int = 0) -> torch.Tensor:
    return _run(*_operands(m, seed), threads)


def _workers() -> list[Path]:
    return [t for t in Path(f"/proc/{os.getpid()}/task").iterdir()
            if (t / "comm").read_text().strip() == "pk-worker"]


@pytest.mark.parametrize("m", [1, 3, 37])
def test_results_do_not_depend_on_the_thread_count(m):
    # every output is computed by one task, whichever thread runs it: the bytes are the same
    one = _gemm(m, 1)
    assert bool(torch.isfinite(one).all())
    for threads in (2, 3, 4):
        assert torch.equal(_gemm(m, threads), one)


def test_concurrent_callers_each_get_their_own_results():
    # one call at a time uses the workers; a caller that finds them busy runs its tasks itself
    want = {i: _gemm(8 + i, 1, seed=i) for i in range(4)}
    got: dict[int, torch.Tensor] = {}

    def work(i: int) -> None:
        for _ in range(3):
            got[i] = _gemm(8 + i, 2, seed=i)

    run_interleaved(work, 4)
    for i in range(4):
        assert torch.equal(got[i], want[i])


@pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/task").exists(), reason="needs fork and /proc")
def test_a_forked_child_runs_threaded_calls():
    # (the child calls no torch op that would enter torch's own OpenMP region: libgomp itself
    # cannot run a region in the child of a process that used one)
    a, b = _operands(37)
    want = _run(a, b, 1)
    _run(a, b, 2)  # the parent's workers exist now; the child inherits none of them
    pid = os.fork()
    if pid == 0:  # child: a threaded call must neither hang nor differ, and start its own workers
        code = 1
        try:
            code = 0 if torch.equal(_run(a, b, 2), want) else 2
            code = code or (0 if _workers() else 3)
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's threaded GEMM did not finish (pool state not reset after fork?)")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0, "1: raised, 2: other bytes, 3: the child started no workers"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc")
def test_idle_workers_sleep():
    # after a call the workers spin for some microseconds, then block on a futex: their state is
    # S (sleeping), and they take no CPU time while nothing is called
    _gemm(37, 2)
    workers = _workers()
    assert workers, "a 2-thread call started no pk-worker thread"
    time.sleep(0.5)

    def cpu_ticks(t: Path) -> int:
        fields = (t / "stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    before = {t.name: cpu_ticks(t) for t in workers}
    time.sleep(0.3)
    for t in workers:
        state = (t / "stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state == "S", f"idle worker {t.name} is in state {state}"
        assert cpu_ticks(t) - before[t.name] <= 1, f"idle worker {t.name} used CPU time"
