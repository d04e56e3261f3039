"""The cpu kernels' standalone self-test (kernels/selftest/): built natively for an x86 ISA level, or
cross-compiled for ARM (aarch64, NEON) and run under qemu-user, where Python cannot load the
libraries. Each family's driver calls the kernels' exported functions on seeded inputs and compares
with scalar code of its own (see kernels/selftest/selftest.h).

    python -m portable_kernels.backends.cpu.selftest                  # every target this machine can run
    python -m portable_kernels.backends.cpu.selftest --target aarch64

aarch64 needs `aarch64-linux-gnu-g++` and `qemu-aarch64` (Debian: g++-aarch64-linux-gnu, qemu-user;
.ci/run installs them when it can); the binary is linked statically so qemu needs no ARM sysroot.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs

from portable_kernels.core.native.build import INCLUDE_DIR, compiler_flags, detected_isa

KERNELS = Path(__file__).parent / "kernels"
SOURCES = KERNELS / "selftest"
#: the x86 levels, highest first; a machine runs its detected level and every one below it
X86_LEVELS = ("avx512", "avx2", "generic")
CROSS = {"aarch64": ("aarch64-linux-gnu-g++", "qemu-aarch64", "neon")}
INSTALL_HINT = {"aarch64": "install the Debian packages g++-aarch64-linux-gnu and qemu-user "
                           "(apt-get install g++-aarch64-linux-gnu qemu-user)"}


@attrs.frozen
class Outcome:
    target: str
    ran: bool             # False: the toolchain or emulator is missing (reason says which)
    passed: bool
    output: str
    reason: str = ""
    command: tuple[str, ...] = ()


def targets() -> list[str]:
    """What can be asked for here: the x86 levels this machine executes, and the cross targets."""
    level = detected_isa()[0]
    x86 = list(X86_LEVELS[X86_LEVELS.index(level):]) if level in X86_LEVELS else ["generic"]
    return x86 + list(CROSS)


def missing_tools(target: str) -> str | None:
    """Why `target` cannot be built and run here, or None."""
    if target in CROSS:
        compiler, runner, _ = CROSS[target]
        absent = [tool for tool in (compiler, runner) if shutil.which(tool) is None]
        return f"{' and '.join(absent)} not found: {INSTALL_HINT[target]}" if absent else None
    if target not in targets():
        return f"this machine ({detected_isa()[0]}) cannot execute a {target} build"
    return None if shutil.which("g++") else "g++ not found"


def build_command(target: str, binary: Path, kernels: Path = KERNELS) -> list[str]:
    """The compiler command line: the library builds' own flags for that level, every driver source
    (kernels: the folder of kernel sources, with the drivers in its selftest/)."""
    if target in CROSS:
        compiler, _, level = CROSS[target]
        extra = ["-static"]  # qemu-user then needs no ARM sysroot
    else:
        compiler, level, extra = "g++", target, []
    sources = sorted(str(p) for p in (kernels / SOURCES.name).glob("*.cpp"))
    return [compiler, "-std=c++17", *compiler_flags(level), "-w", *extra, f"-I{INCLUDE_DIR}", f"-I{kernels}",
            *sources, "-o", str(binary)]


def run(target: str, timeout: float = 600.0, kernels: Path = KERNELS) -> Outcome:
    """Build the driver for `target` and run it (under qemu for a cross target)."""
    reason = missing_tools(target)
    if reason:
        return Outcome(target, False, False, "", reason)
    with tempfile.TemporaryDirectory(prefix="pk-selftest-") as tmp:
        binary = Path(tmp) / f"selftest-{target}"
        cmd = build_command(target, binary, kernels)
        built = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if built.returncode:
            return Outcome(target, True, False, built.stdout + built.stderr, "the driver did not compile", tuple(cmd))
        exe = [CROSS[target][1], str(binary)] if target in CROSS else [str(binary)]
        done = subprocess.run(exe, capture_output=True, text=True, timeout=timeout)
        return Outcome(target, True, done.returncode == 0, done.stdout + done.stderr, "", tuple(cmd))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m portable_kernels.backends.cpu.selftest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", action="append", choices=list(X86_LEVELS) + list(CROSS),
                        help="build to test (repeatable; default: every target this machine can run)")
    args = parser.parse_args(argv)
    status = 0
    for target in args.target or targets():
        out = run(target)
        if not out.ran:
            print(f"[{target}] skipped: {out.reason}")
            continue
        print(f"[{target}] {' '.join(out.command[:1])} ... ({'passed' if out.passed else 'FAILED'})")
        print(out.output.rstrip())
        status |= not out.passed
    return status


if __name__ == "__main__":
    sys.exit(main())
