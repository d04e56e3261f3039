"""Command line: `python -m portable_kernels {generate,demo,doctor,warmup,conformance,layouts,ep-cost,bench,gpu-report}` (also installed
as `portable-kernels`)."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from .tools.demo import (MlaShape, MoeShape, format_header, format_legend, format_providers, format_table,
                       format_verdicts, run_demo)
    for name in ("tokens", "hidden", "experts", "seqlen", "repeats"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name} must be a positive int, got {getattr(args, name)}")
    if args.hidden % 128 or args.experts % 4:
        raise CliError("--hidden must be a multiple of 128 and --experts a multiple of 4 (4 expert groups)")
    moe = MoeShape(tokens=args.tokens, hidden=args.hidden, experts=args.experts)
    mla = MlaShape(seqlen=args.seqlen)
    runs = run_demo(moe, mla, repeats=args.repeats)
    print(format_header(moe, mla))
    print(format_table(runs))
    print(format_providers(runs))
    print(format_verdicts(runs))
    print(format_legend())
    if args.plot:
        from .tools.demo.plot import plot_weight_formats
        print(f"wrote {plot_weight_formats(args.plot)}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from .core.registry import available_backends
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
            if op in info.not_mapped:
                print(f"      not mapped: {info.not_mapped[op]}")
    _ep_engine_report()
    _native_report()
    return 0


def _ep_engine_report() -> None:
    from .core.registry import registry
    print("ep low-latency engines (ep.Buffer takes the first that serves its group):")
    for engine in registry().ep_engines():
        print(f"  {engine.backend}.{engine.name} (priority {engine.priority}): {engine.doc}")
    print("  all-to-all (built in): all_to_all_single over the group's transport, for every group")


def _options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--option takes KEY=VALUE, got {pair!r}")
        options[key] = value
    return options


def _native_report() -> None:
    from .core.native import build
    level, extras = build.detected_isa()
    print(f"native host code (deepjit, knobs PK_JIT_*; PK_NATIVE=0 disables): built for {build.isa()} "
          f"(detected {level}{', ' + ', '.join(sorted(extras)) if extras else ''}), "
          f"flags {' '.join(build.compiler_flags())}, threads = torch.get_num_threads() = {build.num_threads()}")
    from .core.native.openmp_wait import openmp_wait_note
    note = openmp_wait_note(build.num_threads())
    if note:
        print(f"  {note}")
    for lib in build.libraries().values():
        print(f"  {lib.family} ({lib.owner}, {lib.source.name}): {lib.status()}")


def _warmup(args: argparse.Namespace) -> int:
    import time

    from .core.native import build
    from .core.registry import available_backends
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
    from .tools.plots import plot_scale_layouts
    for path in plot_scale_layouts(args.plot):
        print(path)
    return 0


def _ep_cost(args: argparse.Namespace) -> int:
    from .tools.ep_cost.cli import run
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401  (optional: the [plot] extra)
        except ImportError as exc:
            raise CliError("drawing needs matplotlib: pip install 'portable-kernels[plot]'") from exc
    return run(args)


def _bench(args: argparse.Namespace) -> int:
    from .tools.bench.cli import run
    return run(args)


def _gpu_report(args: argparse.Namespace) -> int:
    from .tools.gpu_report.cli import run
    return run(args)


def _generate(args: argparse.Namespace) -> int:
    from .models.deepseek.generate import run
    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="portable_kernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a DeepSeek-style MoE layer and an MLA decode step on every backend",
                          description="Run one DeepSeek-V3-shaped MoE layer (scaled down) and one MLA decode step "
                                      "on every backend that can run here (natively, or in emulation on CPU "
                                      "tensors), from the same model code, with the expert weights prepared once "
                                      "per backend; print per backend the providers that ran, the bytes each "
                                      "weight format stores, implicit conversions, the difference from the cpu "
                                      "backend's outputs and the time.")
    demo.add_argument("--tokens", type=int, default=64, help="tokens in the MoE batch (default 64)")
    demo.add_argument("--hidden", type=int, default=1024, help="hidden size, a multiple of 128 (default 1024)")
    demo.add_argument("--experts", type=int, default=16, help="routed experts, in 4 groups (default 16)")
    demo.add_argument("--seqlen", type=int, default=512, help="longest cached sequence of the MLA step (default 512)")
    demo.add_argument("--repeats", type=int, default=3, help="timed runs per step; the median is shown (default 3)")
    demo.add_argument("--plot", metavar="DIR", default=None,
                      help="also draw the byte layouts of one expert weight on every backend into DIR")
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
    from .tools.ep_cost.cli import add_parser as add_ep_cost
    add_ep_cost(sub, _ep_cost)
    from .tools.bench.cli import add_parser as add_bench
    add_bench(sub, _bench)
    from .tools.gpu_report.cli import add_parser as add_gpu_report
    add_gpu_report(sub, _gpu_report)
    from .models.deepseek.generate import add_parser as add_generate
    add_generate(sub, _generate)
    return parser


class CliError(Exception):
    """A problem with the command line itself (printed as one line, exit status 2)."""


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user error (unknown backend or op, bad option, missing optional package,
    unwritable folder) prints one line to stderr and returns 2, without a traceback."""
    from .core.errors import PortableKernelsError
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for reports that record their command
    try:
        return args.func(args)
    except (CliError, PortableKernelsError, ValueError, OSError) as exc:
        message = str(exc).strip().replace("\n", " ")
        print(f"portable_kernels {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
