"""Timing: wall time per call with the device synchronized, paired rounds, medians with spreads.

Rule: both sides of a case are timed the same way in the same process, round by round (the side
that goes first alternates), so drifts in machine load hit both; a round's batch is sized once
(calls enough to last `min_seconds`) and the device is synchronized before the clock starts and
before it stops, so asynchronous launches are counted in full.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import statistics
import time
from typing import Any, Callable

import attrs
import torch

Fn = Callable[[], Any]


def synchronizer(device: torch.device) -> Fn:
    """A function that waits for the device's queued work (a no-op on CPU)."""
    if device.type == "cpu":
        return lambda: None
    module = getattr(torch, device.type, None)
    sync = getattr(module, "synchronize", None)
    if sync is None:
        raise ValueError(f"bench: no torch.{device.type}.synchronize to time device {device} with")
    return lambda: sync(device)


def calls_per_batch(fn: Fn, sync: Fn, min_seconds: float) -> int:
    """How many calls make a batch of at least min_seconds (after a warm-up call)."""
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - start, 1e-7)
    return max(1, math.ceil(min_seconds / one))


def batch_seconds(fn: Fn, sync: Fn, calls: int) -> float:
    """Seconds per call over one batch, the device synchronized at both ends."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


@attrs.frozen
class Spread:
    """Median and spread of samples: min, max and the quartiles (equal to the median for one sample)."""

    median: float
    min: float
    max: float
    q1: float
    q3: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: list[float]) -> Spread:
        if not samples:
            raise ValueError("Spread.of needs at least one sample")
        q1 = q3 = statistics.median(samples)
        if len(samples) >= 2:
            q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
        return cls(statistics.median(samples), min(samples), max(samples), q1, q3, tuple(samples))

    def to_json(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.min, "max": self.max, "q1": self.q1, "q3": self.q3,
                "samples": list(self.samples)}


@attrs.frozen
class Paired:
    """Seconds per call of both sides and the per-round ratio peer / op (> 1: the op is faster)."""

    op: Spread
    peer: Spread
    ratio: Spread
    op_calls: int
    peer_calls: int


def paired_rounds(op: Fn, peer: Fn, sync: Fn, rounds: int, min_seconds: float) -> Paired:
    """Time op and peer in `rounds` paired rounds (the side that goes first alternates)."""
    if rounds < 1:
        raise ValueError(f"bench: rounds must be >= 1, got {rounds}")
    n_op, n_peer = calls_per_batch(op, sync, min_seconds), calls_per_batch(peer, sync, min_seconds)
    t_op, t_peer, ratios = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            a = batch_seconds(op, sync, n_op)
            b = batch_seconds(peer, sync, n_peer)
        else:
            b = batch_seconds(peer, sync, n_peer)
            a = batch_seconds(op, sync, n_op)
        t_op.append(a)
        t_peer.append(b)
        ratios.append(b / a)
    return Paired(Spread.of(t_op), Spread.of(t_peer), Spread.of(ratios), n_op, n_peer)


def rotated_rounds(sides: dict[str, Fn], rounds: int, clock: Callable[[], float] = time.perf_counter
                   ) -> dict[str, list[float]]:
    """Seconds of one call of each side per round, `rounds` rounds after one warm-up call each; the
    side that goes first rotates each round, so every side sees the same load (for benchmarks of
    calls long enough to time one at a time)."""
    if rounds < 1:
        raise ValueError(f"bench: rounds must be >= 1, got {rounds}")
    for fn in sides.values():  # build and warm
        fn()
    names = list(sides)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = clock()
            sides[name]()
            seconds[name].append(clock() - t)
    return seconds


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _release_free_heap() -> None:
    """Hand memory freed earlier back to the OS (glibc malloc_trim), so that the resident set holds
    live data only and a call's growth does not depend on what ran before it. No-op elsewhere."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)


def peak_memory_mib(fn: Fn, device: torch.device) -> float | None:
    """Peak memory growth (MiB) during one call: the device allocator's peak on an accelerator, the
    process's peak resident set on CPU (Linux /proc, after returning freed heap memory to the OS;
    None where it cannot be measured)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    if device.type != "cpu":
        return None
    _release_free_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident set (VmHWM) to the current one
    except OSError:
        return None
    before = _proc_status_kib("VmRSS")
    fn()
    peak = _proc_status_kib("VmHWM")
    if before is None or peak is None:
        return None
    return (peak - before) / 1024
