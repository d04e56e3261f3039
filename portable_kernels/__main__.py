"""Command line: `python -m portable_kernels {demo,doctor}` (also installed as `portable-kernels`)."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from .demo import format_table, run_demo
    rows = run_demo(m=args.m, n=args.n, k=args.k)
    print(f"fp8_gemm_nt  M={args.m} N={args.n} K={args.k}  (bf16 out; diffs are calc_diff)")
    print(format_table(rows))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from .registry import available_backends
    for name, info in available_backends().items():
        state = "available" if info.available else f"unavailable: {info.reason}"
        emulation = ", emulation on cpu" if info.emulation else ""
        print(f"{name}: devices {list(info.device_types)}{emulation}; {state}")
        for op, providers in sorted(info.providers.items()):
            print(f"    {op}: {', '.join(providers)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .demo import DEMO_SHAPE
    parser = argparse.ArgumentParser(prog="portable_kernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run one FP8 FFN GEMM on every runnable backend and print a table")
    for dim, value in DEMO_SHAPE.items():
        demo.add_argument(f"--{dim}", type=int, default=value)
    demo.set_defaults(func=_demo)
    doctor = sub.add_parser("doctor", help="list backends, their devices, providers and availability")
    doctor.set_defaults(func=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
