"""`deep_gemm.testing.bench`: DeepGEMM's timing helpers with its signatures.

`bench` times calls of fn (CUDA events on a CUDA device, the host clock otherwise) and returns the
mean seconds per call, as DeepGEMM's does. `bench_kineto` returns, for each kernel name asked for,
the mean seconds per call of the whole fn: the portable ops' kernels do not carry DeepGEMM's kernel
names, so a per-kernel profile table cannot be matched by name. With DG_USE_NVIDIA_TOOLS=1 it
returns 1 per name without running fn, as DeepGEMM does under Nsight and compute-sanitizer.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

import torch

from ...core.harness import empty_suppress, suppress_stdout_stderr

__all__ = ["bench", "bench_kineto", "empty_suppress", "suppress_stdout_stderr"]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _mean_seconds(fn: Callable[[], Any], num_tests: int, barrier: Optional[Callable[[], Any]] = None) -> float:
    if barrier is not None:
        barrier()
    _sync()
    start = time.perf_counter()
    for _ in range(num_tests):
        fn()
    _sync()
    return (time.perf_counter() - start) / num_tests


def bench(fn: Callable[[], Any], num_warmups: int = 5, num_tests: int = 10, high_precision: bool = False) -> float:
    """Mean seconds per call of fn over num_tests calls after num_warmups (high_precision: accepted;
    it only changes how DeepGEMM hides launch overhead on a GPU)."""
    for _ in range(num_warmups):
        fn()
    return _mean_seconds(fn, num_tests)


def bench_kineto(fn: Callable[[], Any], kernel_names: str | tuple, num_tests: int = 30,
                 suppress_kineto_output: bool = False, trace_path: Optional[str] = None, flush_l2: bool = True,
                 with_multiple_kernels: bool = False, barrier: Optional[Callable[[], Any]] = None) -> float | tuple:
    """Seconds per call of fn, once per name in kernel_names (a str gives a float, a tuple a tuple);
    see the module docstring for why every name gets the whole call's time."""
    if not isinstance(kernel_names, (str, tuple)):
        raise TypeError(f"bench_kineto: argument 'kernel_names' is {type(kernel_names).__name__}; "
                        "expected a str or a tuple of str. Fix: pass one kernel name or a tuple of them")
    count = len(kernel_names) if isinstance(kernel_names, tuple) else 1
    if int(os.environ.get("DG_USE_NVIDIA_TOOLS", 0)):
        return (1,) * count if isinstance(kernel_names, tuple) else 1
    suppress = suppress_stdout_stderr if suppress_kineto_output else empty_suppress
    with suppress():
        fn()
        seconds = _mean_seconds(fn, num_tests, barrier)
    return (seconds,) * count if isinstance(kernel_names, tuple) else seconds
