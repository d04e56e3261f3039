"""The cpu backend's native providers against the torch code a user would write instead.

Run: python benchmarks/cpu_bench.py [bench options]   (e.g. --full --rounds 5 --case m_grouped)

A thin call of `python -m portable_kernels bench --backend cpu --threads 1,<cores>`: the cases
(with issue 12's targets), the paired timing, the JSON, table and plots all live in
portable_kernels/tools/bench/ (see `python -m portable_kernels bench --help`). Options given here are
passed on; --threads given here replaces the default.
"""

from __future__ import annotations

import os
import sys

from portable_kernels.__main__ import main


def argv(args: list[str]) -> list[str]:
    threads = [] if any(a.startswith("--threads") for a in args) else ["--threads", f"1,{os.cpu_count()}"]
    return ["bench", "--backend", "cpu", *threads, *args]


if __name__ == "__main__":
    sys.exit(main(argv(sys.argv[1:])))
