"""Small-call latency of the public cpu ops against their peers (issue 23): topk vs torch.topk and
fp8_gemm_nt (prepared operands, bf16 d) vs torch.matmul on the fp32 weight dequantized once.

In one process, each round times `calls` back-to-back calls of the op and then of its peer (the
order alternates per round); per case it prints the median µs of each with the min..max over
rounds and the median of the per-round ratios peer/op (> 1: the op is faster). Wall time
(time.perf_counter) by default; `--clock thread` takes this thread's CPU time instead, which other
processes on a crowded machine hardly disturb — fair only with `--threads 1` (a multi-threaded
peer's workers are not counted).

    python benchmarks/small_call_latency.py [--rounds 15] [--threads 1] [--clock thread]
    python benchmarks/small_call_latency.py --compare /tmp/base   # another checkout, alternating

`--compare ROOT` runs this script in child processes, one round each, alternating between this
checkout and ROOT (a `git worktree add ROOT <commit>`), and prints both side by side: the two
trees share the machine's load round by round. Report `uptime` with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

TOPK_CASES = ((1, 1024, 8), (8, 4096, 64), (1, 32768, 2048))
GEMM_CASES = ((1, 256, 256), (1, 2048, 7168))


def _point_at(root: str) -> None:
    """Import portable_kernels (and its mapped packages) from checkout `root`, not the editable one."""
    import importlib
    finder = importlib.import_module("__editable___portable_kernels_0_1_0_finder")
    finder.MAPPING.update({"deepjit": f"{root}/deepjit", "portable_kernels": f"{root}/portable_kernels",
                           "portable_kernels.backends": f"{root}/backends",
                           "portable_kernels.layouts": f"{root}/layouts"})


def _cases() -> dict[str, tuple[Callable[[], Any], Callable[[], Any], int]]:
    import torch

    import portable_kernels as pk
    from portable_kernels.ops.quant.fp8 import dequantize_reference

    gen = torch.Generator().manual_seed(23)
    out: dict[str, tuple[Callable[[], Any], Callable[[], Any], int]] = {}
    for b, n, k in TOPK_CASES:
        x = torch.randn(b, n, generator=gen)
        calls = 2000 if n * b <= 8192 else 200
        out[f"topk {b}x{n} k={k}"] = ((lambda x=x, k=k: pk.topk(x, k)), (lambda x=x, k=k: torch.topk(x, k)), calls)
    for m, n, k in GEMM_CASES:
        x = torch.randn(m, k, generator=gen)
        w = torch.randn(n, k, generator=gen) * k ** -0.5
        prepared = pk.prepare_inputs(pk.fp8_gemm_nt, a=pk.per_token_cast_to_fp8(x), b=pk.per_block_cast_to_fp8(w))
        w_once = dequantize_reference(pk.per_block_cast_to_fp8(w))  # fp32, dequantized once and kept
        d = torch.empty(m, n, dtype=torch.bfloat16)
        calls = 2000 if n * k <= 65536 else 20
        out[f"fp8_gemm_nt {m}x{n}x{k}"] = (
            (lambda pa=prepared["a"], pb=prepared["b"], d=d: pk.fp8_gemm_nt(pa, pb, d)),
            (lambda x=x, w=w_once: torch.matmul(x, w.T)), calls)
    return out


_CLOCK = time.perf_counter


def _time(fn: Callable[[], Any], calls: int) -> float:
    clock = _CLOCK
    start = clock()
    for _ in range(calls):
        fn()
    return (clock() - start) / calls * 1e6


def measure(rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per case: {"op": [µs per round], "peer": [...], "ratio": [peer/op per round]}."""
    results: dict[str, dict[str, list[float]]] = {}
    for name, (op, peer, calls) in _cases().items():
        for _ in range(3):  # build, plan, warm caches
            op(), peer()
        rows: dict[str, list[float]] = {"op": [], "peer": [], "ratio": []}
        for r in range(rounds):
            first, second = ((op, "op"), (peer, "peer")) if r % 2 == 0 else ((peer, "peer"), (op, "op"))
            times = {first[1]: _time(first[0], calls), second[1]: _time(second[0], calls)}
            rows["op"].append(times["op"])
            rows["peer"].append(times["peer"])
            rows["ratio"].append(times["peer"] / times["op"])
        results[name] = rows
    return results


def _summary(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def _print_one(results: dict[str, dict[str, list[float]]]) -> None:
    print(f"{'case':28s} {'op µs':>22s} {'peer µs':>22s} {'peer/op':>20s}")
    for name, rows in results.items():
        print(f"{name:28s} {_summary(rows['op']):>22s} {_summary(rows['peer']):>22s} "
              f"{_summary(rows['ratio'], 2):>20s}")


def _compare(root: str, rounds: int, extra: list[str]) -> None:
    here = str(Path(__file__).resolve().parent.parent)
    merged: dict[str, dict[str, dict[str, list[float]]]] = {here: {}, root: {}}
    for r in range(rounds):
        for tree in ((here, root) if r % 2 == 0 else (root, here)):
            out = subprocess.run([sys.executable, __file__, "--child", tree, "--rounds", "1", *extra], check=True,
                                 capture_output=True, text=True, cwd="/tmp").stdout
            for name, rows in json.loads(out.splitlines()[-1]).items():
                into = merged[tree].setdefault(name, {"op": [], "peer": [], "ratio": []})
                for key, values in rows.items():
                    into[key].extend(values)
    print(f"{'case':28s} {'this tree µs':>22s} {'other tree µs':>22s} {'peer/op here':>18s} {'peer/op other':>18s}")
    for name in merged[here]:
        a, b = merged[here][name], merged[root][name]
        print(f"{name:28s} {_summary(a['op']):>22s} {_summary(b['op']):>22s} {_summary(a['ratio'], 2):>18s} "
              f"{_summary(b['ratio'], 2):>18s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--compare", metavar="ROOT", help="alternate child processes of this tree and ROOT")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (the native kernels follow it)")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall")
    parser.add_argument("--child", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    extra = ["--clock", args.clock] + (["--threads", str(args.threads)] if args.threads else [])
    if args.compare:
        _compare(str(Path(args.compare).resolve()), args.rounds, extra)
        return
    global _CLOCK
    _CLOCK = time.thread_time if args.clock == "thread" else time.perf_counter
    if args.child:
        _point_at(args.child)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(measure(args.rounds)))
        return
    from portable_kernels.core.native.build import isa
    print(f"isa {isa()}, torch threads {torch.get_num_threads()}, clock {args.clock}, "
          f"load {os.getloadavg()[0]:.2f}")
    _print_one(measure(args.rounds))


if __name__ == "__main__":
    main()
