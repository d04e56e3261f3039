"""Compile every nvidia Triton kernel for a GPU architecture without a GPU (run as a script in a
process WITHOUT TRITON_INTERPRET): `python gpu_compile_all.py sm90 [--all-configs]`.

The specimens and the compile live in portable_kernels/tools/gpu_report (`python -m portable_kernels
gpu-report` reads the cubins too); this prints one line per compiled kernel and "COMPILED n" last,
and exits 1 on the first failure or a kernel over 227 KiB of shared memory.
"""

from __future__ import annotations

import os
import sys
import time

assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without TRITON_INTERPRET"

from portable_kernels.tools.gpu_report.aot import compiling_for  # noqa: E402
from portable_kernels.tools.gpu_report.report import MAX_SHARED_BYTES_PER_BLOCK  # noqa: E402
from portable_kernels.backends.nvidia.gpu_specimens import all_specimens  # noqa: E402


def main(argv: list[str]) -> int:
    arch = argv[0]
    count = 0
    for config, name, call in all_specimens("--all-configs" in argv):
        record: list = []
        start = time.perf_counter()
        try:
            with compiling_for(arch, record):
                call()
        except Exception as exc:  # report which specimen failed, with the compiler's message
            print(f"FAILED {name} (config {config}) for {arch}: {type(exc).__name__}: {exc}", flush=True)
            return 1
        for kernel in record:
            count += 1
            shared = kernel.metadata.shared
            if shared > MAX_SHARED_BYTES_PER_BLOCK:
                print(f"FAILED {name} for {arch}: {kernel.name} needs {shared} B of shared memory (max "
                      f"{MAX_SHARED_BYTES_PER_BLOCK})", flush=True)
                return 1
            print(f"{arch} {name:40s} {kernel.name:32s} shared={shared:6d} B  {time.perf_counter() - start:5.1f} s",
                  flush=True)
    print(f"COMPILED {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
