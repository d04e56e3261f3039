"""Command line: `python -m portable_kernels {demo,doctor,conformance,layouts}` (also installed as `portable-kernels`)."""

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
        for fmt in info.formats:
            print(f"  format {fmt.describe()}")
        for op, providers in sorted(info.details.items()):
            print(f"    {op}:")
            for provider in providers:
                print(f"      {provider.describe()}")
    return 0


def _conformance(args: argparse.Namespace) -> int:
    from .testing import run_conformance
    options = {"arch": args.arch} if args.arch else {}
    report = run_conformance(backend=args.backend, ops=args.ops or None, quick=args.quick, progress=sys.stderr,
                             **options)
    print(report.format_table())
    return 0 if report.ok else 1


def _layouts(args: argparse.Namespace) -> int:
    from .plots import plot_scale_layouts
    for path in plot_scale_layouts(args.plot):
        print(path)
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
    lay = sub.add_parser("layouts", help="draw the per-chip byte layouts (needs the [plot] extra: matplotlib)")
    lay.add_argument("--plot", metavar="DIR", required=True, help="folder to write the PNGs into")
    lay.set_defaults(func=_layouts)
    conf = sub.add_parser("conformance", help="run every op's contract cases on one backend")
    conf.add_argument("--backend", default=None, help="backend name (default: cpu)")
    conf.add_argument("--quick", action="store_true", help="fewer, smaller cases")
    conf.add_argument("--arch", default=None, help="layout option, e.g. sm90 or sm100 for nvidia")
    conf.add_argument("--ops", nargs="*", help="only these ops")
    conf.set_defaults(func=_conformance)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
