"""`python -m portable_kernels gpu-report --arch sm90|sm100 [--all-configs] [--json FILE] [--strict]`:
compile every nvidia Triton kernel specimen for the arch (no GPU), print the report table, the
gate's violations and the roofline bounds; --json writes rows, violations and bounds to FILE."""

from __future__ import annotations

import argparse
import json
import os
from typing import Callable

import attrs


def add_parser(sub, func: Callable) -> None:
    p = sub.add_parser("gpu-report", help="static report of the nvidia Triton kernels compiled for sm90/sm100 "
                                          "(no GPU): MMA family, TMA, registers, spills, shared memory, roofline",
                       description=__doc__)
    p.add_argument("--arch", required=True, choices=("sm90", "sm100"), help="compile for sm_90a or sm_100a")
    p.add_argument("--all-configs", action="store_true", help="every autotune config of the GEMMs, not just the default")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the report as JSON to FILE")
    p.add_argument("--strict", action="store_true", help="exit 1 when the gate finds a violation")
    p.set_defaults(func=func)


def run(args: argparse.Namespace) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise ValueError("gpu-report compiles for the GPU: unset TRITON_INTERPRET")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise ValueError("gpu-report needs triton: pip install triton") from exc
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    from .report import format_rows, format_violations, gate, run_report
    from .roofline import bounds, format_bounds
    rows = run_report(args.arch, args.all_configs)
    violations = gate(rows)
    print(f"gpu report for {args.arch} ({'all configs' if args.all_configs else 'default configs'}, "
          f"{len(rows)} compiled kernels; static: read from the cubins, nothing ran)")
    print(format_rows(rows))
    print(format_violations(violations))
    print(format_bounds(args.arch))
    if args.json:
        payload = {"arch": args.arch, "all_configs": args.all_configs,
                   "rows": [attrs.asdict(r) for r in rows], "violations": [attrs.asdict(v) for v in violations],
                   "roofline": [{**attrs.asdict(b.problem), "memory_s": b.memory_s, "compute_s": b.compute_s,
                                 "bound": b.bound} for b in bounds(args.arch)]}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    return 1 if args.strict and violations else 0
