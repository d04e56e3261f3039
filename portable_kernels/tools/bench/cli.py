"""`python -m portable_kernels bench`: run the benchmark cases and write JSON, a table and plots.

    bench                                   every family, quick set, backends available natively here
    bench --backend cpu --family gemm topk  chosen backends and families
    bench --backend nvidia:arch=sm100       a backend with options (on CPU tensors: emulation, marked)
    bench --threads 1,2 --rounds 7 --out DIR
    bench --compare A.json B.json [--out DIR]   two runs side by side (table; plots with matplotlib)

User errors (unknown backend or family, bad numbers, a file that is not a bench result) are one
line on stderr with exit status 2; a case that errors makes the exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

from .cases import FAMILIES
from .output import has_matplotlib, write_outputs
from .report import format_compare, format_header, format_summary, format_table, load_run
from .runner import BenchUsageError, run_bench

DEFAULT_OUT = "bench-results"


def _threads(text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 1 for c in counts):
        raise BenchUsageError(f"--threads takes a comma-separated list of positive ints (e.g. 1,2), got {text!r}")
    return counts


def _writable(folder: str) -> None:
    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise BenchUsageError(f"--out {folder} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK):
        raise BenchUsageError(f"--out {folder} is not writable")


def add_parser(sub: Any, handler: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="time the ops against the torch code a user would write instead; JSON + plots",
                       description="Run each op family's benchmark cases on the chosen backend(s), the public op "
                                   "on prepared inputs beside the torch code a user would write instead, in one "
                                   "process (paired rounds, medians with min-max); write bench.json, table.txt and "
                                   "(with matplotlib) one plot per family into --out.")
    p.add_argument("--backend", action="append", metavar="NAME[:KEY=VALUE,...]",
                   help="backend to run (repeatable; default: every backend available natively here); a backend "
                        "named here that has no device runs in emulation on CPU tensors, marked as such")
    p.add_argument("--family", nargs="+", metavar="NAME", help=f"families to run (default all: {', '.join(FAMILIES)})")
    p.add_argument("--case", nargs="+", metavar="TEXT", help="only cases whose 'name shape' contains one of these")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the quick set: the largest shapes left out (default)")
    size.add_argument("--full", action="store_true", help="every case, the largest shapes included")
    size.add_argument("--tiny", action="store_true", help="tiny shapes: a smoke test of the command (times mean "
                                                          "nothing)")
    p.add_argument("--rounds", type=int, default=5, help="paired rounds per case (default 5)")
    p.add_argument("--min-time", type=float, default=0.02, metavar="SECONDS",
                   help="shortest timed batch of calls per side and round (default 0.02)")
    p.add_argument("--threads", default=None, metavar="LIST", help="torch thread counts, e.g. 1,2 (default: torch's)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"output folder (default ./{DEFAULT_OUT})")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two bench.json files (or their folders) "
                                                                  "instead of running")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or lines on stderr")
    p.set_defaults(func=handler)
    return p


def _compare(args: argparse.Namespace) -> int:
    a, b = load_run(args.compare[0]), load_run(args.compare[1])
    print(format_compare(a, b))
    if has_matplotlib():
        from .plot import plot_compare
        for path in plot_compare(a, b, args.out):
            print(f"wrote {path}")
    else:
        print("no plots: matplotlib is not installed (pip install 'portable-kernels[bench]')")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.compare:
        return _compare(args)
    if args.rounds < 1:
        raise BenchUsageError(f"--rounds must be >= 1, got {args.rounds}")
    if args.min_time <= 0:
        raise BenchUsageError(f"--min-time must be > 0, got {args.min_time}")
    size = "full" if args.full else "tiny" if args.tiny else "quick"
    _writable(args.out)  # before the run, not after minutes of it
    doc = run_bench(backends=args.backend, families=args.family, size=size, rounds=args.rounds,
                    threads=_threads(args.threads) if args.threads else None, min_seconds=args.min_time,
                    progress="none" if args.no_progress else "auto", match=args.case,
                    command=" ".join(["python -m portable_kernels", *getattr(args, "argv", sys.argv[1:])]))
    print(format_header(doc))
    print(format_table(doc))
    print(format_summary(doc))
    for path in write_outputs(doc, args.out):
        print(f"wrote {path}")
    return 1 if doc["summary"]["errors"] else 0
