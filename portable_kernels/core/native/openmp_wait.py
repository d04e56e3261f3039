"""Whether OpenMP threads will spin-wait, and the advice for shared machines.

The native cpu kernels (and torch's own CPU ops) run OpenMP parallel regions through the one
libgomp torch loads. By default libgomp lets an idle thread spin for a long time before it sleeps;
on a machine where other processes compete for the cores, a spinning thread holds a core its
partner needs, and a parallel region can take many times longer than on one thread (measured on
this project's 2-core machine at load 4-5: the demo's MoE layer 86 ms with default waiting,
17.5 ms with GOMP_SPINCOUNT=10000, 36 ms with OMP_WAIT_POLICY=passive; docs/cpu-backend.md).
libgomp reads these variables once, when it is loaded (at `import torch`), so a library cannot
change them afterwards: `doctor` says so when it matters. Since 2026-12-04 the native kernels run
on their own worker threads (pk_pool.h: a short spin, then a futex sleep) instead of OpenMP, except
the AMX GEMM engine; torch's own ops still wait in libgomp, which is what the note is about now.
"""

from __future__ import annotations

import os

#: variables that bound libgomp's spin-waiting (either one is enough)
WAIT_VARIABLES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
ADVICE = ("start Python with GOMP_SPINCOUNT=10000 (or OMP_WAIT_POLICY=passive), or use "
          "torch.set_num_threads(1), when other processes compete for the cores")


def busy_cores() -> float | None:
    """The 1-minute load average (runnable processes), or None where the OS does not report it."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def openmp_wait_note(threads: int, environ: dict[str, str] | None = None, load: float | None = None,
                     cores: int | None = None) -> str | None:
    """A line for `doctor` when OpenMP threads spin-wait by default, or None when nothing applies
    (one thread, or a wait variable set). It states the load against the cores, when known."""
    env = os.environ if environ is None else environ
    if threads <= 1 or any(env.get(name) for name in WAIT_VARIABLES):
        return None
    load = busy_cores() if load is None else load
    cores = usable_cores() if cores is None else cores
    now = f"load average {load:.1f} on {cores} cores now" if load is not None else f"{cores} cores"
    crowded = load is not None and load > cores
    return (f"OpenMP threads spin while they wait (torch's own ops, the AMX GEMM engine; {' and '.join(WAIT_VARIABLES)} unset; {now}"
            f"{': crowded' if crowded else ''}): {ADVICE}; see docs/cpu-backend.md")
