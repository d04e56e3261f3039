"""Command line: `python -m portable_kernels {demo,doctor,warmup,conformance,layouts}` (also installed as `portable-kernels`)."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from .demo import format_legend, format_table, format_verdicts, run_demo
    for dim in ("m", "n", "k"):
        if getattr(args, dim) < 1:
            raise CliError(f"--{dim} must be a positive int, got {getattr(args, dim)}")
    rows = run_demo(m=args.m, n=args.n, k=args.k)
    print(f"fp8_gemm_nt  M={args.m} N={args.n} K={args.k}  (bf16 out)")
    print(format_table(rows))
    print(format_verdicts(rows))
    print(format_legend())
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
    _native_report()
    return 0


def _options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--option takes KEY=VALUE, got {pair!r}")
        options[key] = value
    return options


def _native_report() -> None:
    from .native import build
    level, extras = build.detected_isa()
    print(f"native host code (deepjit, knobs PK_JIT_*; PK_NATIVE=0 disables): built for {build.isa()} "
          f"(detected {level}{', ' + ', '.join(sorted(extras)) if extras else ''}), "
          f"flags {' '.join(build.compiler_flags())}, threads = torch.get_num_threads() = {build.num_threads()}")
    for lib in build.libraries().values():
        print(f"  {lib.family} ({lib.owner}, {lib.source.name}): {lib.status()}")


def _warmup(args: argparse.Namespace) -> int:
    import time

    from .native import build
    from .registry import available_backends
    available_backends()  # loads the backends, which declare their native libraries
    libs = [lib for lib in build.libraries().values() if args.backend in (None, lib.owner) or lib.owner == build.SHARED]
    failed = 0
    start = time.perf_counter()
    for i, lib in enumerate(libs, 1):
        bar = "#" * (20 * i // len(libs))
        print(f"\r[{bar:20s}] {i}/{len(libs)} {lib.family:24s}", end="", file=sys.stderr, flush=True)
        failed += lib.get() is None
        print(f"\r[{bar:20s}] {i}/{len(libs)} {lib.family:24s} {lib.status()}", file=sys.stderr)
    print(f"built or found {len(libs) - failed} of {len(libs)} native libraries in {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


def _conformance(args: argparse.Namespace) -> int:
    from .testing import run_conformance
    options = _options(args.option or [])
    if args.arch:
        options["arch"] = args.arch
    report = run_conformance(backend=args.backend, ops=args.ops or None, quick=args.quick, progress=sys.stderr,
                             **options)
    print(report.format_table())
    return 0 if report.ok else 1


def _layouts(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401  (optional: the [plot] extra)
    except ImportError as exc:
        raise CliError("drawing needs matplotlib: pip install 'portable-kernels[plot]'") from exc
    from .plots import plot_scale_layouts
    for path in plot_scale_layouts(args.plot):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .demo import DEMO_SHAPE
    parser = argparse.ArgumentParser(prog="portable_kernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run one FP8 FFN GEMM on every runnable backend and print a table",
                          description="Quantize a DeepSeek-V3-sized FFN weight once per backend (prepare_inputs), "
                                      "quantize activations into the consumer's format, run fp8_gemm_nt on every "
                                      "backend that can run here (natively or in emulation on CPU tensors) and "
                                      "compare with the exact product.")
    meaning = {"m": "rows of the activation (tokens)", "n": "rows of the weight (output features)",
               "k": "the shared inner dimension (hidden size)"}
    for dim, value in DEMO_SHAPE.items():
        demo.add_argument(f"--{dim}", type=int, default=value, help=f"{meaning[dim]} (default {value})")
    demo.set_defaults(func=_demo)
    doctor = sub.add_parser("doctor", help="list backends, their devices, providers and availability")
    doctor.set_defaults(func=_doctor)
    warm = sub.add_parser("warmup", help="build (or find in the cache) every native kernel library ahead of time")
    warm.add_argument("--backend", default=None, help="only this backend's libraries (plus the shared ones)")
    warm.set_defaults(func=_warmup)
    lay = sub.add_parser("layouts", help="draw the per-chip byte layouts (needs the [plot] extra: matplotlib)")
    lay.add_argument("--plot", metavar="DIR", required=True, help="folder to write the PNGs into")
    lay.set_defaults(func=_layouts)
    conf = sub.add_parser("conformance", help="run every op's contract cases on one backend")
    conf.add_argument("--backend", default=None, help="backend name (default: cpu)")
    conf.add_argument("--quick", action="store_true", help="fewer, smaller cases")
    conf.add_argument("--arch", default=None, help="the nvidia option arch: sm90 or sm100")
    conf.add_argument("--option", action="append", metavar="KEY=VALUE",
                      help="a backend option (repeatable), e.g. --option soc=950 for ascend; see doctor")
    conf.add_argument("--ops", nargs="*", help="only these ops")
    conf.set_defaults(func=_conformance)
    return parser


class CliError(Exception):
    """A problem with the command line itself (printed as one line, exit status 2)."""


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user error (unknown backend or op, bad option, missing optional package,
    unwritable folder) prints one line to stderr and returns 2, without a traceback."""
    from .errors import PortableKernelsError
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CliError, PortableKernelsError, ValueError, OSError) as exc:
        message = str(exc).strip().replace("\n", " ")
        print(f"portable_kernels {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
