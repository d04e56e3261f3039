"""Throughput of the layout encoders on DeepSeek-V3 shapes, against torch.clone of the same bytes.

Run: python benchmarks/layouts_bench.py [bench options]   (e.g. --threads 1 --rounds 7)

A thin call of `python -m portable_kernels bench --family layouts`: each encoder (the torch one and,
where it exists, the native one prepare_inputs prefers) beside a clone moving as many bytes;
ratio = clone time / encoder time (issue 12: >= 0.5). The cases live in
portable_kernels/tools/bench/cases/layouts.py.
"""

from __future__ import annotations

import sys

from portable_kernels.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--family", "layouts", *sys.argv[1:]]))
