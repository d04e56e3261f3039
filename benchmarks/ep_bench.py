"""Throughput of the distributed Buffer's dispatch + combine against a raw all_to_all_single of
the same bytes, side by side in one run, at several group sizes.

Run: python benchmarks/ep_bench.py [--ranks 2 4 8] [--tokens 512] [--hidden 4096] [--topk 8]
     [--experts 64] [--rounds 15] [--fp8] [--backend gloo|nccl] [--local | --phases | --primitives]

Per group size, R local processes (CPU tensors over Gloo; with --backend nccl one GPU per rank)
run, after warm-up, `rounds` rounds of
  buffer: Buffer.dispatch (layout given) + Buffer.combine of the received rows, and
  raw:    two all_to_all_single calls moving the same token rows (out and back) with the same
          splits, from pre-packed send buffers into pre-allocated receive buffers, and
  raw_alloc: the same two calls into receive buffers allocated per call (what user code writes;
          the Buffer, like DeepEP, returns fresh tensors — on CPU every fresh large tensor pays
          page faults, which a GPU's caching allocator hides) —
interleaved round by round, each timed from a barrier to the slowest rank's end. Payload = the
token rows that cross ranks (dispatch recv_x bytes + combine send bytes, all ranks), as DeepEP
counts them; GB/s = payload / time. Printed: median GB/s with [min, max] over the rounds, and
ratio = raw time / buffer time, per round (1.0 = no overhead over the bare collective; target
>= 0.8 on Gloo), and the median CPU milliseconds per round of all ranks' processes together (every
thread, Gloo's too) for buffer and raw: where ranks share few cores, the wall-time ratio follows
the CPU ratio. NCCL runs the same code on `cuda:rank` (untested here: this machine has no GPU).
A benchmark, not a test: it prints only.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from portable_kernels.ops.ep import Buffer
from portable_kernels.ops.quant.fp8 import per_token_cast_to_fp8
from portable_kernels.testing.ep_cases import random_routing
from portable_kernels.testing.ep_distributed import run_ranks
from portable_kernels.testing.generators import randn


def _synced_seconds(group: Any, device: torch.device, fn) -> tuple[float, float]:
    """Seconds from a barrier to the slowest rank finishing fn, and the CPU seconds all ranks'
    processes spent meanwhile (every thread: the Gloo workers' copies too)."""
    dist.barrier(group)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    cpu_spent = torch.tensor([time.process_time() - cpu], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(cpu_spent, group=group)
    return float(elapsed.item()), float(cpu_spent.item())


def bench_rank(rank: int, num_ranks: int, group: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    device = torch.device("cpu")
    if cfg["backend"] == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    torch.set_num_threads(1)
    tokens, hidden, experts = cfg["tokens"], cfg["hidden"], cfg["experts"]
    x = randn(tokens, hidden, seed=1000 + rank, dtype=torch.bfloat16, device=device)
    idx = random_routing(tokens, cfg["topk"], experts, seed=2000 + rank, device=device)
    payload = tuple(per_token_cast_to_fp8(x)) if cfg["fp8"] else x
    buffer = Buffer(group, int(4e9), timeout=300)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    layout = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    first = buffer.dispatch(payload, topk_idx=idx, **layout)
    recv_rows = (first[0][0] if cfg["fp8"] else first[0]).shape[0]
    back = torch.randn(recv_rows, hidden, device=device).bfloat16()

    # the raw collective: the same rows, splits and direction, already packed, no metadata
    send_splits = in_rank.sum(dim=0).tolist()
    recv_splits = first[4].rank_prefix_matrix[:, rank].diff(prepend=torch.zeros(1, device=device,
                                                                                 dtype=torch.int32)).tolist()
    row_bytes = hidden * (1 if cfg["fp8"] else 2)
    raw_send = torch.empty(sum(send_splits), row_bytes, dtype=torch.uint8, device=device)
    raw_recv = torch.empty(recv_rows, row_bytes, dtype=torch.uint8, device=device)
    raw_back_send = torch.empty(recv_rows, hidden * 2, dtype=torch.uint8, device=device)
    raw_back_recv = torch.empty(sum(send_splits), hidden * 2, dtype=torch.uint8, device=device)

    def run_buffer() -> None:
        recv = buffer.dispatch(payload, topk_idx=idx, **layout)
        buffer.combine(back, recv[4])

    def run_raw() -> None:
        dist.all_to_all_single(raw_recv, raw_send, recv_splits, send_splits, group=group)
        dist.all_to_all_single(raw_back_recv, raw_back_send, send_splits, recv_splits, group=group)

    def run_raw_allocating() -> None:
        """What user code would write: a fresh output per call, as the Buffer returns fresh tensors."""
        out = torch.empty_like(raw_recv)
        dist.all_to_all_single(out, raw_send, recv_splits, send_splits, group=group)
        back = torch.empty_like(raw_back_recv)
        dist.all_to_all_single(back, raw_back_send, send_splits, recv_splits, group=group)

    runs = {"buffer": run_buffer, "raw": run_raw, "raw_alloc": run_raw_allocating}
    for _ in range(cfg["warmup"]):
        for fn in runs.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(cfg["rounds"]):
        for name, fn in runs.items():
            wall, spent = _synced_seconds(group, device, fn)
            times[name].append(wall)
            cpu[name].append(spent)
    moved = torch.tensor([recv_rows * (row_bytes + hidden * 2)], dtype=torch.float64, device=device)
    dist.all_reduce(moved, group=group)
    return {"times": times, "cpu": cpu, "payload_bytes": float(moved.item())}


def phases_rank(rank: int, num_ranks: int, group: Any, cfg: dict[str, Any]) -> dict[str, tuple[float, float, float]]:
    """Per step, median ms of: wall time (from a barrier), this process's CPU time (every thread,
    Gloo's workers too) and the calling thread's CPU time (the Buffer's own Python and kernels):
    Buffer.dispatch and Buffer.combine against the raw out and back collectives of the same rows."""
    torch.set_num_threads(1)
    tokens, hidden, experts = cfg["tokens"], cfg["hidden"], cfg["experts"]
    x = randn(tokens, hidden, seed=1000 + rank, dtype=torch.bfloat16)
    idx = random_routing(tokens, cfg["topk"], experts, seed=2000 + rank)
    payload = tuple(per_token_cast_to_fp8(x)) if cfg["fp8"] else x
    buffer = Buffer(group, int(4e9), timeout=300)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    layout = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    first = buffer.dispatch(payload, topk_idx=idx, **layout)
    recv_rows = first[4].recv_src_idx.numel()
    back = torch.randn(recv_rows, hidden).bfloat16()
    send_splits = in_rank.sum(dim=0).tolist()
    recv_splits = first[4].rank_prefix_matrix[:, rank].diff(prepend=torch.zeros(1, dtype=torch.int32)).tolist()
    row_bytes = hidden * (1 if cfg["fp8"] else 2)
    raw_send = torch.empty(sum(send_splits), row_bytes, dtype=torch.uint8)
    raw_recv = torch.empty(recv_rows, row_bytes, dtype=torch.uint8)
    raw_back_send = torch.empty(recv_rows, hidden * 2, dtype=torch.uint8)
    raw_back_recv = torch.empty(sum(send_splits), hidden * 2, dtype=torch.uint8)
    state: dict[str, Any] = {}

    def dispatch() -> None:
        state["recv"] = buffer.dispatch(payload, topk_idx=idx, **layout)

    steps = {
        "Buffer.dispatch": dispatch,
        "Buffer.combine": lambda: buffer.combine(back, state["recv"][4]),
        "raw out": lambda: dist.all_to_all_single(raw_recv, raw_send, recv_splits, send_splits, group=group),
        "raw back": lambda: dist.all_to_all_single(raw_back_recv, raw_back_send, send_splits, recv_splits,
                                                   group=group),
    }
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in steps}
    for round_ in range(cfg["warmup"] + cfg["rounds"]):
        for name, fn in steps.items():
            dist.barrier(group)
            wall, proc, thread = time.perf_counter(), time.process_time(), time.thread_time()
            fn()
            if round_ >= cfg["warmup"]:
                samples[name].append(((time.perf_counter() - wall) * 1e3, (time.process_time() - proc) * 1e3,
                                      (time.thread_time() - thread) * 1e3))
    return {name: tuple(statistics.median(v[i] for v in values) for i in range(3)) for name, values in samples.items()}


def primitives_rank(rank: int, num_ranks: int, group: Any, cfg: dict[str, Any]) -> dict[str, str]:
    """The collective choices behind the transport, timed on this group: a small header by
    allgather vs by all-to-all, and an even all-to-all of 2*hidden-byte rows with and without the
    rank's own block in the collective, against a memcpy of that block."""
    from torch._C._distributed_c10d import AllgatherOptions, AllToAllOptions

    torch.set_num_threads(1)
    header = torch.arange(46, dtype=torch.int64)
    gathered = torch.empty(num_ranks * 46, dtype=torch.int64)
    repeated = header.repeat(num_ranks)
    rows = cfg["tokens"] * num_ranks
    width = cfg["hidden"] * 2
    send = torch.randint(0, 255, (rows, width), dtype=torch.uint8)
    recv = torch.empty_like(send)
    block = cfg["tokens"]
    even = [block] * num_ranks
    no_self = list(even)
    no_self[rank] = 0

    def median_ms(fn) -> str:
        times = []
        for _ in range(cfg["rounds"]):
            dist.barrier(group)
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        times.sort()
        return f"{statistics.median(times):.3f} [{times[0]:.3f}, {times[-1]:.3f}]"

    return {
        "header by allgather": median_ms(lambda: group._allgather_base(gathered, header, AllgatherOptions()).wait()),
        "header by all-to-all": median_ms(lambda: group.alltoall_base(gathered, repeated, [46] * num_ranks,
                                                                      [46] * num_ranks, AllToAllOptions()).wait()),
        "rows, own block in the collective": median_ms(lambda: dist.all_to_all_single(recv, send, even, even,
                                                                                      group=group)),
        "rows, own block left out": median_ms(lambda: dist.all_to_all_single(
            recv[:rows - block], send[:rows - block], no_self, no_self, group=group) if rank == num_ranks - 1
            else dist.all_to_all_single(recv[block:], send[block:], no_self, no_self, group=group)),
        "memcpy of the own block": median_ms(lambda: recv[:block].copy_(send[:block])),
    }


def local_costs(cfg: dict[str, Any]) -> None:
    """The Buffer's own CPU work per call, without peers: one rank of a one-rank Gloo group (its
    'collectives' are local copies into fresh outputs), against torch copying the same token rows
    into a fresh tensor (page faults included, as for any fresh CPU tensor) and into a reused one."""
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    x = randn(cfg["tokens"], cfg["hidden"], seed=1000, dtype=torch.bfloat16)
    idx = random_routing(cfg["tokens"], cfg["topk"], cfg["experts"], seed=2000)
    buffer = Buffer(group, int(4e9), timeout=60)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, cfg["experts"])
    layout = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    recv = buffer.dispatch(x, topk_idx=idx, **layout)
    target = torch.empty_like(x)

    def median_ms(fn) -> str:
        for _ in range(cfg["warmup"]):
            fn()
        times = []
        for _ in range(cfg["rounds"]):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        times.sort()
        return f"{statistics.median(times):.2f} [{times[0]:.2f}, {times[-1]:.2f}]"

    print(f"local costs, one rank, tokens={cfg['tokens']} hidden={cfg['hidden']} (ms, median [min, max]):")
    print(f"  dispatch {median_ms(lambda: buffer.dispatch(x, topk_idx=idx, **layout))}")
    print(f"  combine  {median_ms(lambda: buffer.combine(recv[0], recv[4]))}")
    print(f"  x.clone() (copy into a fresh tensor) {median_ms(lambda: x.clone())}")
    print(f"  copy of x into a reused tensor {median_ms(lambda: target.copy_(x))}")


def _summary(payload: float, seconds: list[float]) -> str:
    rates = sorted(payload / t / 1e9 for t in seconds)
    return f"{statistics.median(rates):.3f} [{rates[0]:.3f}, {rates[-1]:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--tokens", type=int, default=512, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--fp8", action="store_true", help="dispatch FP8 (data + per-128 scales), combine bf16")
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--local", action="store_true", help="only the Buffer's own CPU work, one rank, no peers")
    parser.add_argument("--phases", action="store_true",
                        help="per step (dispatch, combine, raw out, raw back): wall, process CPU and calling-thread "
                             "CPU ms per call, rank 0 and the slowest rank")
    parser.add_argument("--primitives", action="store_true",
                        help="time the collective choices of the transport (ms per call, rank 0's view)")
    args = parser.parse_args()
    cfg = vars(args)
    if args.local:
        local_costs(cfg)
        return
    if args.phases:
        for num_ranks in args.ranks:
            outcomes = run_ranks(num_ranks, phases_rank, (cfg,), backend=args.backend, timeout_s=900)
            if not all(o.ok for o in outcomes):
                raise SystemExit("\n".join(o.describe() for o in outcomes))
            print(f"{num_ranks} ranks, tokens/rank={args.tokens} hidden={args.hidden} fp8={args.fp8} "
                  "(ms per call, medians: wall / process CPU / calling-thread CPU; rank 0, then the max over ranks):")
            for name in outcomes[0].value:
                worst = [max(o.value[name][i] for o in outcomes) for i in range(3)]
                print(f"  {name:<16} " + " / ".join(f"{v:.1f}" for v in outcomes[0].value[name])
                      + "    max " + " / ".join(f"{v:.1f}" for v in worst))
        return
    if args.primitives:
        for num_ranks in args.ranks:
            outcomes = run_ranks(num_ranks, primitives_rank, (cfg,), backend=args.backend, timeout_s=600)
            if not all(o.ok for o in outcomes):
                raise SystemExit("\n".join(o.describe() for o in outcomes))
            print(f"{num_ranks} ranks, rows of {args.hidden * 2} bytes, {args.tokens} per peer "
                  "(ms, median [min, max]):")
            for name, value in outcomes[0].value.items():
                print(f"  {name:<34} {value}")
        return
    print(f"ep_bench {datetime.date.today()} backend={args.backend} tokens/rank={args.tokens} hidden={args.hidden} "
          f"topk={args.topk} experts={args.experts} fp8={args.fp8} rounds={args.rounds} torch={torch.__version__}")
    print(f"{'ranks':>5} {'payload MB':>10} {'buffer GB/s median [min, max]':>30} {'raw GB/s':>22} {'ratio':>22}"
          f" {'raw_alloc GB/s':>22} {'ratio_alloc':>22} {'cpu ms buffer / raw':>20}")
    for num_ranks in args.ranks:
        outcomes = run_ranks(num_ranks, bench_rank, (cfg,), backend=args.backend, timeout_s=1800)
        bad = [o.describe() for o in outcomes if not o.ok]
        if bad:
            raise SystemExit("\n".join(bad))
        result = outcomes[0].value
        payload, times = result["payload_bytes"], result["times"]
        line = f"{num_ranks:>5} {payload / 1e6:>10.1f} {_summary(payload, times['buffer']):>30}"
        for name in ("raw", "raw_alloc"):
            ratios = sorted(r / b for r, b in zip(times[name], times["buffer"]))
            line += (f" {_summary(payload, times[name]):>22} {statistics.median(ratios):>7.3f} "
                     f"[{ratios[0]:.3f}, {ratios[-1]:.3f}]")
        cpu = result["cpu"]
        line += f" {statistics.median(cpu['buffer']) * 1e3:>10.1f} / {statistics.median(cpu['raw']) * 1e3:.1f}"
        print(line)


if __name__ == "__main__":
    main()
