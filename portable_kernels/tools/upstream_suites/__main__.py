"""CLI: python -m portable_kernels.tools.upstream_suites [--deepgemm DIR] [--tilekernels DIR]
[--flashmla DIR] [--deepep DIR] [--backend SPEC ...] [--quick] [--json FILE]."""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import attrs

from . import deepep, deepgemm, flashmla, tilekernels
from .engine import Backend, format_report, run_suite, to_json

DEFAULT_BACKENDS = ("cpu", "nvidia:arch=sm90", "nvidia:arch=sm100", "ascend:soc=950")
#: --quick: at most this many parametrizations of each pytest test function
QUICK_SAMPLE = 4
#: --flag -> the suite it runs, and what the flag's help says
SUITES = {
    "deepgemm": (deepgemm.SUITE, "a DeepGEMM checkout (its tests/ are run)"),
    "tilekernels": (tilekernels.SUITE, "a TileKernels checkout (tests/moe, quant, transpose)"),
    "flashmla": (flashmla.SUITE, "a FlashMLA checkout (its tests/: each file's case list, sampled)"),
    "deepep": (deepep.SUITE, "a DeepEP checkout (tests/legacy, run as programs over Gloo ranks)"),
}


def _commit(checkout: Path, given: str | None) -> str:
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m portable_kernels.tools.upstream_suites", description=__doc__)
    for flag, (suite, text) in SUITES.items():
        parser.add_argument(f"--{flag}", type=Path, help=text)
        parser.add_argument(f"--{flag}-commit", help=f"the {suite.name} commit, when the checkout is not a git tree")
    parser.add_argument("--backend", action="append", dest="backends",
                        help=f"NAME[:KEY=VALUE,...], repeatable (default: {' '.join(DEFAULT_BACKENDS)})")
    parser.add_argument("--quick", action="store_true",
                        help=f"sample: DeepGEMM's DG_MQA_NUM_CASES=6, at most {QUICK_SAMPLE} cases per pytest test "
                             "function or case-list file")
    parser.add_argument("--sample", type=int, default=None,
                        help="cases kept per pytest test function or case-list file (0: all that fit a CPU)")
    parser.add_argument("--test-timeout", type=int, default=900, help="seconds per test function (default 900)")
    parser.add_argument("--only", action="append", default=[],
                        help="run only these files (DeepGEMM: test_bf16.py; TileKernels: tests/moe), repeatable")
    parser.add_argument("--workdir", type=Path, help="keep the rewritten tree and logs here")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not any(getattr(args, flag) for flag in SUITES):
        parser.error("give at least one of " + ", ".join(f"--{flag}" for flag in SUITES))
    backends = [Backend.parse(s) for s in (args.backends or DEFAULT_BACKENDS)]
    sample = args.sample if args.sample is not None else (QUICK_SAMPLE if args.quick else 0)

    out, reports = [], []
    for flag, (suite, _) in SUITES.items():
        checkout = getattr(args, flag)
        if checkout is None:
            continue
        if args.only:
            keep = tuple(f for f in suite.files if any(f.endswith(o) for o in args.only))
            if not keep:
                continue
            suite = attrs.evolve(suite, files=keep)
        start = time.monotonic()
        workdir = args.workdir / suite.name if args.workdir else None
        results, notes = run_suite(suite, checkout, backends, quick=args.quick, test_timeout=args.test_timeout,
                                   sample=sample, workdir=workdir)
        commit = _commit(checkout, getattr(args, f"{flag}_commit"))
        notes = [f"{checkout} at {commit}", f"{time.monotonic() - start:.0f} s wall", *notes]
        report = format_report(suite.name, results, notes)
        print(report, flush=True)
        reports.append(report)
        out.append(to_json(suite.name, checkout, commit, results, notes))
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "suites": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
