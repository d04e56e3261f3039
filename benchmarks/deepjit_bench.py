"""deepjit benchmark: cold build, in-process hit, fresh-process disk hit, pybind11 call overhead.

usage: python benchmarks/deepjit_bench.py [--repeats N]
Uses a private temporary cache (never your own). Targets from the issue: in-process hit <= 50 us,
disk hit in a fresh process <= 5 ms (interpreter start-up and `import deepjit` reported apart).
Every figure is the median over rounds (timeit rounds, or fresh processes) with (min-max) after it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

import deepjit

MODULE = r"""
#include <pybind11/pybind11.h>
int add(int a, int b) { return a + b; }
PYBIND11_MODULE(DEEPJIT_MODULE_NAME, m) { m.def("add", &add); }
"""
LIBRARY = 'extern "C" int add(int a, int b) { return a + b; }\n'
FLAGS = ["-O2"]

FRESH_PROCESS = r"""
import json, sys, time
t0 = time.perf_counter()
import deepjit
t1 = time.perf_counter()
module = deepjit.compile("bench_module", sys.argv[1], toolchain="host", kind="pybind11", flags=["-O2"])
t2 = time.perf_counter()
assert module.add(1, 2) == 3
print(json.dumps({"import_ms": 1e3 * (t1 - t0), "hit_ms": 1e3 * (t2 - t1)}))
"""


def _per_call_us(statement, number: int, repeat: int = 7) -> tuple[float, float, float]:
    """(median, min, max) over `repeat` rounds of the time per call in microseconds."""
    rounds = [1e6 * total / number for total in timeit.repeat(statement, number=number, repeat=repeat)]
    return statistics.median(rounds), min(rounds), max(rounds)


def _spread(values: tuple[float, float, float], scale: float, unit: str, digits: int) -> str:
    median, low, high = (v * scale for v in values)
    return f"{median:.{digits}f} {unit} ({low:.{digits}f}-{high:.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="fresh processes for the disk-hit figure")
    args = parser.parse_args()
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="deepjit-bench-") as root:
        os.environ["DEEPJIT_CACHE_DIR"] = root
        jit = deepjit.JitContext()

        start = time.perf_counter()
        module = jit.compile("bench_module", MODULE, toolchain="host", kind="pybind11", flags=FLAGS)
        rows.append(("cold build + load, pybind11 module", f"{time.perf_counter() - start:.2f} s", ""))
        start = time.perf_counter()
        library = jit.compile("bench_library", LIBRARY, toolchain="host", kind="ctypes", flags=FLAGS)
        rows.append(("cold build + load, ctypes library", f"{time.perf_counter() - start:.2f} s", ""))

        hit = _per_call_us(lambda: jit.compile("bench_module", MODULE, toolchain="host", kind="pybind11", flags=FLAGS), 20000)
        rows.append(("in-process hit, compile()", _spread(hit, 1, "us", 1), "target <= 50 us (median)"))

        runs = []
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, "-c", FRESH_PROCESS, MODULE], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout))
        disk = [r["hit_ms"] for r in runs]
        imports = [r["import_ms"] for r in runs]
        rows.append(("disk hit in a fresh process, compile()",
                     _spread((statistics.median(disk), min(disk), max(disk)), 1, "ms", 2), "target <= 5 ms (median)"))
        rows.append(("  import deepjit in that process",
                     _spread((statistics.median(imports), min(imports), max(imports)), 1, "ms", 1), "start-up, not counted"))

        def python_add(a: int, b: int) -> int:
            return a + b

        plain = _per_call_us(lambda: python_add(1, 2), 200000)
        bound = _per_call_us(lambda: module.add(1, 2), 200000)
        ctypes_call = _per_call_us(lambda: library.add(1, 2), 200000)
        rows.append(("call: plain Python function", _spread(plain, 1e3, "ns", 0), ""))
        rows.append(("call: pybind11 function", _spread(bound, 1e3, "ns", 0),
                     f"overhead {1e3 * (bound[0] - plain[0]):+.0f} ns vs Python (medians)"))
        rows.append(("call: ctypes function", _spread(ctypes_call, 1e3, "ns", 0),
                     f"overhead {1e3 * (ctypes_call[0] - plain[0]):+.0f} ns vs Python (medians)"))

    width = max(len(r[0]) for r in rows)
    print(f"deepjit {deepjit.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>24}  {note}")


if __name__ == "__main__":
    main()
