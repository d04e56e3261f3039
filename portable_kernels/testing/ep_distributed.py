"""Run a function on R local processes that share a torch.distributed group (tests, benchmarks).

`run_ranks(num_ranks, target, args)` starts R processes, initialises a process group of
the given backend on a free local port, calls `target(rank, num_ranks, group, *args)` on each and
returns one `RankOutcome` per rank: the value returned, or the exception's type and message, the
exit code, and the seconds the call took. The whole run is bounded by `timeout_s`: a rank still
alive then is killed and reported as hung, so a test can never hang. `target` must be importable
(a module-level function): ranks start from a fork server, not from the caller's process.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import socket
import tempfile
import time
import traceback
from typing import Any, Callable, Sequence

import attrs
import torch

#: the process-group timeout of the spawned ranks (a Buffer's own timeout is set per test)
GROUP_TIMEOUT_S = 60.0


@attrs.frozen(eq=False)
class RankOutcome:
    """What one rank did: value (when it returned), error_type / error (when it raised),
    exitcode (None when it had to be killed), seconds spent inside target."""

    rank: int
    exitcode: int | None
    value: Any = None
    error_type: str | None = None
    error: str | None = None
    seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.exitcode == 0 and self.error_type is None

    def describe(self) -> str:
        if self.ok:
            return f"rank {self.rank}: ok in {self.seconds:.2f} s"
        if self.exitcode is None:
            return f"rank {self.rank}: hung (killed)"
        return f"rank {self.rank}: exit {self.exitcode}, {self.error_type}: {self.error}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, num_ranks: int, port: int, backend: str, target: Callable[..., Any], args: Sequence[Any],
           out_dir: str, threads: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(threads)
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=num_ranks,
                                timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    except BaseException as exc:  # e.g. the free port taken before rank 0's store bound it: the parent retries
        torch.save({"init_error": f"{type(exc).__name__}: {exc}"}, os.path.join(out_dir, f"rank{rank}.pt"))
        os._exit(INIT_FAILED)
    result: dict[str, Any]
    start = time.perf_counter()
    try:
        value = target(rank, num_ranks, dist.group.WORLD, *args)
        result = {"value": value}
    except BaseException as exc:  # reported to the parent, which decides what was expected
        result = {"error_type": type(exc).__name__, "error": f"{exc}\n{traceback.format_exc()}"}
    result["seconds"] = time.perf_counter() - start
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    # no destroy_process_group: a peer may be dead, and tearing down Gloo would then wait on it
    os._exit(0)


def _context() -> Any:
    """A fork server that has imported torch and portable_kernels once, so a rank starts in a
    fraction of a second instead of re-importing torch (seconds per rank on a small CI machine).
    The server forks before any rank touches threads or a process group."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "portable_kernels", "portable_kernels.ops.ep",
                                "portable_kernels.testing.ep_distributed"])
    return ctx


def run_ranks(num_ranks: int, target: Callable[..., Any], args: Sequence[Any] = (), *, backend: str = "gloo",
              timeout_s: float = 120.0, threads: int = 1) -> list[RankOutcome]:
    """Run target(rank, num_ranks, group, *args) on num_ranks spawned processes; see the module docstring.
    A run in which a rank could not join the group (its port was taken between free_port() and the
    store's bind) is started again on a fresh port, up to INIT_ATTEMPTS times."""
    for attempt in range(INIT_ATTEMPTS):
        outcomes, init_failed = _run_once(num_ranks, target, args, backend, timeout_s, threads)
        if not init_failed:
            break
    return outcomes


#: exit code of a rank whose init_process_group raised, and how many times run_ranks starts a group
INIT_FAILED = 3
INIT_ATTEMPTS = 3


def _run_once(num_ranks: int, target: Callable[..., Any], args: Sequence[Any], backend: str, timeout_s: float,
              threads: int) -> tuple[list[RankOutcome], bool]:
    ctx = _context()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="pk-ep-") as out_dir:
        procs = [ctx.Process(target=_entry, args=(r, num_ranks, port, backend, target, tuple(args), out_dir, threads),
                             daemon=True) for r in range(num_ranks)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0.0))
        outcomes = []
        for r, p in enumerate(procs):
            if p.is_alive():
                p.kill()
                p.join()
                outcomes.append(RankOutcome(r, None))
                continue
            path = os.path.join(out_dir, f"rank{r}.pt")
            saved = torch.load(path, weights_only=False) if os.path.exists(path) else {}
            if "init_error" in saved:
                saved = {"error_type": "InitError", "error": saved["init_error"]}
            outcomes.append(RankOutcome(r, p.exitcode, saved.get("value"), saved.get("error_type"),
                                        saved.get("error"), saved.get("seconds")))
        return outcomes, any(o.exitcode == INIT_FAILED for o in outcomes)


def exec_blocks(rank: int, num_ranks: int, group: Any, blocks: Sequence[str], name: str) -> bool:
    """A run_ranks target: run documentation code blocks in order in one namespace holding `group`."""
    namespace: dict[str, Any] = {"__name__": f"doc_{name}", "group": group}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{name} block {i}", "exec"), namespace)
    return True
