"""`deep_ep.utils.testing`: DeepEP's timing helpers with its signatures and return shapes — `bench`
gives (mean, min, max) seconds of fn; `bench_kineto` gives, for every kernel name asked for, the
mean seconds of the whole fn (this library's transfers do not carry DeepEP's kernel names)."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch

__all__ = ["bench", "bench_kineto", "flush_l2_cache"]


def flush_l2_cache(enabled: bool = True) -> None:
    """Write 256 MB on a CUDA device (DeepEP's L2 flush); nothing elsewhere."""
    if enabled and torch.cuda.is_available():
        torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda").zero_()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _times(fn: Callable[[], Any], num_tests: int, post_fn: Optional[Callable[[], Any]], flush_l2: bool,
           barrier: Optional[Callable[[], Any]] = None) -> list[float]:
    out = []
    for _ in range(num_tests):
        flush_l2_cache(flush_l2)
        if barrier is not None:
            barrier()
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        out.append(time.perf_counter() - start)
        if post_fn is not None:
            post_fn()
    return out


def bench(fn: Callable[[], Any], num_warmups: int = 50, num_tests: int = 50,
          post_fn: Optional[Callable[[], Any]] = None, flush_l2: bool = True) -> tuple[float, float, float]:
    """(mean, min, max) seconds per call over num_tests calls after num_warmups, the first dropped (as DeepEP)."""
    for _ in range(num_warmups):
        fn()
    times = _times(fn, max(num_tests, 2), post_fn, flush_l2)[1:]
    return sum(times) / len(times), min(times), max(times)


def bench_kineto(fn: Callable[[], Any], kernel_names: str | tuple, num_tests: int = 30,
                 suppress_kineto_output: bool = False, trace_path: Optional[str] = None, flush_l2: bool = True,
                 barrier_comm_profiling: bool = False, num_kernels_per_period: int = 1,
                 barrier: Optional[Callable[[], Any]] = None) -> float | tuple:
    """Mean seconds of fn once per name in kernel_names (a str gives a float, a tuple a tuple).

    With num_kernels_per_period = k > 1 (a name launched k times per call, e.g. a dispatch's send and
    receive halves around a hook) each name gives a list of k durations, as DeepEP's; without a
    kernel timeline each entry is the call's mean split evenly over its k launches."""
    if not isinstance(kernel_names, (str, tuple)):
        raise TypeError(f"bench_kineto: kernel_names is {type(kernel_names).__name__}; expected a str or a tuple")
    if isinstance(num_kernels_per_period, bool) or not isinstance(num_kernels_per_period, int) \
            or num_kernels_per_period < 1:
        raise ValueError(f"bench_kineto: num_kernels_per_period is {num_kernels_per_period!r}; expected an int >= 1")
    fn()
    times = _times(fn, num_tests, None, flush_l2, barrier)
    mean = sum(times) / len(times)
    k = num_kernels_per_period
    one = mean if k == 1 else [mean / k] * k
    return tuple(one for _ in kernel_names) if isinstance(kernel_names, tuple) else one
