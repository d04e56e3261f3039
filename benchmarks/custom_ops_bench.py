"""What the torch.library boundary costs per call: the public op in eager mode vs the same call
through `torch.ops.portable_kernels.<op>` (what a torch.compile graph, vLLM or SGLang runs), and the
`is_compiling()` check every public op now starts with.

Per case, rounds alternate the two calls in one process (CPU time of this thread, so other
processes add little noise); printed: median µs per call and the spread (min..max over rounds).
The op path = dispatcher + rebuilding prepared operands (PreparedTensor's checked constructor) +
the public function; "boundary" is its median minus the eager median.
Run: `python benchmarks/custom_ops_bench.py [--rounds 15 --calls 2000]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from typing import Any, Callable

import torch

import portable_kernels as pk
from portable_kernels.compiled import is_compiling
from portable_kernels.torch_ops import operand_args


def _per_call_us(fn: Callable[[], Any], calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls * 1e6


def _cases() -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    torch.manual_seed(0)
    ops = torch.ops.portable_kernels
    contract = pk.get_contract("fp8_gemm_nt")
    x = torch.randn(1, 128, dtype=torch.bfloat16)
    a = pk.per_token_cast_to_fp8(x, prepare_for=pk.fp8_gemm_nt)
    b = pk.prepare_inputs(pk.fp8_gemm_nt, b=pk.per_block_cast_to_fp8(torch.randn(128, 128)))["b"]
    d = torch.empty(1, 128, dtype=torch.bfloat16)
    gemm_args = (*operand_args(contract, "a", a), *operand_args(contract, "b", b), d, None, None)

    scores = torch.randn(1, 1024)
    xc = torch.randn(4, 256)

    q = torch.randn(1, 1, 16, 576, dtype=torch.bfloat16)
    cache = torch.randn(4, 64, 1, 576, dtype=torch.bfloat16)
    table = torch.arange(4, dtype=torch.int32)[None]
    seqlens = torch.tensor([200], dtype=torch.int32)
    meta, splits = pk.get_mla_metadata(seqlens, 16, 1)
    out, lse = torch.empty(1, 1, 16, 512, dtype=torch.bfloat16), torch.empty(1, 16, 1)
    mla_args = (q, cache, table, seqlens, 512, list(meta.tensors), meta.num_splits, meta.backend, meta.batch_size,
                meta.num_q_tokens_per_head_k, meta.num_heads_k, meta.num_heads_q, meta.is_fp8_kvcache, meta.topk, True,
                None, False, False, None, out, lse)
    return {
        "fp8_gemm_nt prepared 1x128x128": (lambda: pk.fp8_gemm_nt(a, b, d),
                                           lambda: ops.fp8_gemm_nt.default(*gemm_args)),
        "topk 1x1024 k=8": (lambda: pk.topk(scores, 8),
                            lambda: ops.topk.default(scores, 8, False, None, None, torch.int64, False, 2**31 - 1,
                                                     float("-inf"), True)),
        "per_token_cast_to_fp8 4x256": (lambda: pk.per_token_cast_to_fp8(xc),
                                        lambda: ops.per_token_cast_to_fp8.default(xc, 128, False, "", "a", "", "",
                                                                                  [])),
        "flash_mla_with_kvcache b1 h16 s_k200": (
            lambda: pk.flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta, splits, out=out, lse=lse),
            lambda: ops.flash_mla_with_kvcache.default(*mla_args)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    check = min(timeit.repeat(is_compiling, number=200_000, repeat=7)) / 200_000 * 1e9
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds x {args.calls} calls")
    print(f"is_compiling() check at the top of every public op: {check:.0f} ns (best of 7 x 200k)")
    print(f"{'case':38s} {'eager µs':>9s} {'spread':>15s} {'torch.ops µs':>13s} {'spread':>15s} {'boundary µs':>12s}")
    for name, (eager, through_op) in _cases().items():
        eager(), through_op()
        e, o = [], []
        for _ in range(args.rounds):
            e.append(_per_call_us(eager, args.calls))
            o.append(_per_call_us(through_op, args.calls))
        me, mo = statistics.median(e), statistics.median(o)
        print(f"{name:38s} {me:9.1f} {min(e):6.1f}..{max(e):6.1f} {mo:13.1f} {min(o):6.1f}..{max(o):6.1f} "
              f"{mo - me:12.1f}")


if __name__ == "__main__":
    main()
