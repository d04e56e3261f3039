"""The cpu backend's sparse MLA prefill (flash_mla_sparse_fwd) three ways on the same bf16 operands:
the native provider, the reference provider (the contract's fp32 math) and the gather + SDPA code a
user would write (the bench mla family's peer), each called directly, paired rounds in one process
(the order rotated every round), medians with min-max (docs/cpu-backend.md, "Sparse MLA prefill").

    python benchmarks/cpu_sparse_prefill.py                                  # V3.2-like, 1 thread
    python benchmarks/cpu_sparse_prefill.py --shape 256,16,4096,512 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics

import torch

from portable_kernels.backends.cpu.providers import mla_prefill as native
from portable_kernels.core.native.build import detected_isa, isa
from portable_kernels.tools.bench.timing import rotated_rounds
from portable_kernels.ops.attention.prefill import SparsePrefillInputs, sparse_prefill_kernel
from portable_kernels.tools.bench.cases.mla import D_V, _build_prefill, _prefill_peer


def _call(i) -> SparsePrefillInputs:
    s_q, h_q, _ = i.q.shape
    return SparsePrefillInputs(i.q, i.kv, i.indices, i.scale, D_V, None, None,
                               torch.empty(s_q, h_q, D_V, dtype=torch.bfloat16), torch.empty(s_q, h_q),
                               torch.empty(s_q, h_q))


def measure(s_q: int, h_q: int, s_kv: int, topk: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per round of each side."""
    i = _build_prefill(s_q, h_q, s_kv, topk)(torch.device("cpu"))
    sides = {"native": lambda: native.sparse_prefill_native(_call(i)),
             "reference": lambda: sparse_prefill_kernel(_call(i)),
             "gather + SDPA": lambda: _prefill_peer(i)}
    return rotated_rounds(sides, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", nargs="+", default=["256,64,4096,2048", "256,16,4096,512"],
                        help="s_q,h_q,s_kv,topk (d = 576)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    level, extras = detected_isa()
    print(f"cpu: detected {level} {sorted(extras)}, native built for {isa()}, engine {native.engines()}, "
          f"{args.threads} thread(s), {args.rounds} rounds")
    for shape in args.shape:
        s_q, h_q, s_kv, topk = (int(x) for x in shape.split(","))
        seconds = measure(s_q, h_q, s_kv, topk, args.rounds)
        nat = seconds["native"]
        parts = []
        for name, t in seconds.items():
            part = f"{name} {statistics.median(t) * 1e3:.0f} ms ({min(t) * 1e3:.0f}-{max(t) * 1e3:.0f})"
            if name != "native":
                ratios = [a / b for a, b in zip(t, nat)]
                part += f" = {statistics.median(ratios):.2f}x native ({min(ratios):.2f}-{max(ratios):.2f})"
            parts.append(part)
        print(f"s_q={s_q} h_q={h_q} d=576 s_kv={s_kv} topk={topk}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
