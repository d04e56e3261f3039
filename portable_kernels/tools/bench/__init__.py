"""Benchmarks of the public ops against the torch code a user would write instead (`python -m
portable_kernels bench`).

Per op family a module of cases (`bench.cases.<family>`): each builds its inputs for a device, calls
the public op on prepared inputs and, as its peer, the plain torch a user would otherwise write.
The runner times both side by side in one process (paired rounds, medians with min-max, the device
synchronized), records which provider ran, and writes a JSON document (machine, versions, every
case), a table and, with matplotlib, one plot per family. A device-check script calls the same code:

    from portable_kernels.tools.bench import run_bench, write_outputs, format_table
    doc = run_bench(backends=["nvidia"], families=["gemm", "topk"], size="quick", rounds=5)
    print(format_table(doc)); write_outputs(doc, "docs/device-runs/DATE-bench")

Rule: benchmarks never assert on time; the numbers are reported with their spread and the command.
"""

from .case import SIZES, Case, Inputs
from .cases import FAMILIES, cases_of
from .output import write_outputs
from .report import format_compare, format_header, format_summary, format_table, load_run
from .runner import SCHEMA, BenchUsageError, Target, resolve_targets, run_bench, run_case

__all__ = ["SIZES", "Case", "Inputs", "FAMILIES", "cases_of", "format_compare", "format_header", "format_summary",
           "format_table", "load_run", "write_outputs", "SCHEMA", "BenchUsageError", "Target", "resolve_targets",
           "run_bench", "run_case"]
