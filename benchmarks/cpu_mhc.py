"""cpu: the native mHC stream kernels (mhc_pre_apply_mix, mhc_post and their backwards;
backends/cpu/kernels/mhc.cpp)
against the contracts' references, side by side in one process: rounds alternate the two, the
median per call and the spread (min..max) are printed, with the machine's load.

    python benchmarks/cpu_mhc.py [--tokens 4096] [--hidden 7168] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from portable_kernels.backends.cpu.providers.mhc import (post_backward_native, post_native,
                                                        pre_apply_mix_backward_native, pre_apply_mix_native)
from portable_kernels.ops.mhc._common import MhcInputs
from portable_kernels.ops.mhc.apply import (post_backward_reference, post_reference, pre_apply_mix_backward_reference,
                                            pre_apply_mix_reference)
from portable_kernels.testing.generators import randn
from portable_kernels.tools.bench.timing import rotated_rounds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--mult", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    n, m, h = args.tokens, args.mult, args.hidden
    x = randn(1, n, m, h, seed=1, dtype=torch.bfloat16)
    mix, y = randn(1, n, m, 1, seed=2), randn(1, n, h, seed=3, dtype=torch.bfloat16)
    post, comb = randn(1, n, m, 1, seed=4), randn(1, n, m, m, seed=5)
    cases = {
        "mhc_pre_apply_mix": (lambda: pre_apply_mix_native(MhcInputs((x, mix))),
                              lambda: pre_apply_mix_reference(x, mix), n * m * h * 2 + n * h * 2),
        "mhc_post": (lambda: post_native(MhcInputs((y, x, post, comb))),
                     lambda: post_reference(y, x, post, comb), n * h * 2 + 2 * n * m * h * 2),
        "mhc_pre_apply_mix_backward": (lambda: pre_apply_mix_backward_native(MhcInputs((y, x, mix))),
                                       lambda: pre_apply_mix_backward_reference(y, x, mix), n * h * 2 + 2 * n * m * h * 2),
        "mhc_post_backward": (lambda: post_backward_native(MhcInputs((x, y, x, post, comb))),
                              lambda: post_backward_reference(x, y, x, post, comb), 2 * n * h * 2 + 3 * n * m * h * 2),
    }
    print(f"tokens {n}, M {m}, H {h}, threads {torch.get_num_threads()}, load {os.getloadavg()}")
    for name, (native, ref, nbytes) in cases.items():
        timed = rotated_rounds({"native": native, "reference": ref}, args.rounds)  # both see the same load
        t_nat, t_ref = timed["native"], timed["reference"]
        mn, mr = statistics.median(t_nat), statistics.median(t_ref)
        print(f"{name:26s} native {mn * 1e3:8.2f} ms ({min(t_nat) * 1e3:.2f}..{max(t_nat) * 1e3:.2f}), "
              f"{nbytes / mn / 1e9:5.1f} GB/s | reference {mr * 1e3:8.2f} ms ({min(t_ref) * 1e3:.2f}.."
              f"{max(t_ref) * 1e3:.2f}) | x{mr / mn:.1f}")


if __name__ == "__main__":
    main()
