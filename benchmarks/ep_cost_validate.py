"""The EP cost model against measurements: Gloo on this machine as a fabric preset, and
benchmarks/ep_bench.py's dispatch + combine timed at several group sizes, measured vs predicted
for the same bytes.

Run: python benchmarks/ep_cost_validate.py [--ranks 2 4 8] [--tokens 512] [--hidden 4096] [--topk 8]
     [--experts 64] [--rounds 15] [--calibration-rounds 21]

1. Calibrate the "fabric" (Gloo over loopback, every byte copied by the CPU), on 2 ranks, from
   the BEST round of each (a lower bound wants the fabric's capability, as the vendor presets use
   maximum bandwidths; the medians are printed beside them):
   - per-message overhead: an all_to_all_single of 8 bytes per peer (own block left out);
   - bandwidth per rank: the same with 16 MB per peer, minus that overhead;
   - all ranks together: the cores' worth of that bandwidth (R processes share the CPU cores);
   - local copy bandwidth: a 64 MB tensor copy on one thread.
2. For each group size, run ep_bench's rounds (Buffer dispatch + combine, and the bare
   all_to_all_single of the same rows: "raw") and predict both with the model, from the very
   routing ep_bench draws: Buffer = header + rows + metadata (ids, source index; no weights, as
   ep_bench dispatches without them), raw = the rows alone.
Printed: the calibrated preset, then per group size the predicted time, the measured median
[min, max] over the rounds and measured / predicted (min and median), the payload (checked equal
to ep_bench's own count) and the Buffer's own work (buffer - raw per round), which the model
leaves out by design. A benchmark, not a test: it prints only.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ep_bench  # noqa: E402  (the benchmark whose rounds are validated)

from portable_kernels.tools.ep_cost import BUFFER_EXCHANGE, GB, ROWS_ONLY, Fabric, MoEShape, Tier, estimate  # noqa: E402
from portable_kernels.testing.ep_cases import random_routing  # noqa: E402
from portable_kernels.testing.ep_distributed import run_ranks  # noqa: E402

SMALL_BYTES = 8
LARGE_BYTES = 16 << 20
COPY_BYTES = 64 << 20


def _median_seconds(group: Any, fn, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        dist.barrier(group)
        start = time.perf_counter()
        fn()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        times.append(float(elapsed))
    return sorted(times)


def calibrate_rank(rank: int, num_ranks: int, group: Any, rounds: int) -> dict[str, list[float]]:
    """Two ranks: all_to_all_single of SMALL and LARGE bytes to the peer (own block left out)."""
    torch.set_num_threads(1)
    out = {}
    for name, size in (("small", SMALL_BYTES), ("large", LARGE_BYTES)):
        send = torch.randint(0, 255, (size,), dtype=torch.uint8)
        recv = torch.empty_like(send)
        splits = [0, 0]
        splits[1 - rank] = size

        def exchange() -> None:
            dist.all_to_all_single(recv, send, splits, splits, group=group)

        exchange()
        out[name] = _median_seconds(group, exchange, rounds)
    return out


def copy_bandwidth(rounds: int) -> list[float]:
    torch.set_num_threads(1)
    src = torch.randint(0, 255, (COPY_BYTES,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        dst.copy_(src)
        rates.append(COPY_BYTES / (time.perf_counter() - start))
    return sorted(rates)


def _spread(values: list[float], scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    values = sorted(v * scale for v in values)
    return f"{fmt.format(statistics.median(values))} [{fmt.format(values[0])}, {fmt.format(values[-1])}]"


def gloo_fabric(rounds: int) -> tuple[Fabric, str]:
    outcomes = run_ranks(2, calibrate_rank, (rounds,), timeout_s=600)
    if not all(o.ok for o in outcomes):
        raise SystemExit("\n".join(o.describe() for o in outcomes))
    small, large = outcomes[0].value["small"], outcomes[0].value["large"]
    overhead = min(small)
    bandwidth = LARGE_BYTES / (min(large) - overhead)
    cores = len(os.sched_getaffinity(0))
    copies = copy_bandwidth(rounds)
    fabric = Fabric(
        "gloo-loopback", (Tier("Gloo loopback", None, bandwidth, 0.0, hops=0, aggregate_bandwidth=cores * bandwidth),),
        message_overhead=overhead, local_bandwidth=max(copies),
        description=f"Gloo all-to-all between local processes on {cores} CPU cores, calibrated on 2 ranks")
    notes = (f"  calibration, median [min, max] of {rounds} rounds:\n"
             f"  per-message overhead ({SMALL_BYTES} B all-to-all, 2 ranks): {_spread(small, 1e6, '{:.1f}')} us\n"
             f"  {LARGE_BYTES >> 20} MB all-to-all, 2 ranks: {_spread(large, 1e3)} ms -> best "
             f"{bandwidth / GB:.3f} GB/s per rank per direction, x {cores} cores = "
             f"{cores * bandwidth / GB:.3f} GB/s for all ranks together\n"
             f"  local copy (64 MB, one thread): {_spread(copies, 1 / GB)} GB/s")
    return fabric, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--calibration-rounds", type=int, default=21)
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"ep_cost_validate {datetime.date.today()} torch={torch.__version__} load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; tokens/rank={args.tokens} hidden={args.hidden} "
          f"top-{args.topk} of {args.experts} experts, bf16, {args.rounds} rounds")
    fabric, notes = gloo_fabric(args.calibration_rounds)
    print(fabric.describe())
    print(notes)
    shape = MoEShape(args.hidden, args.topk, args.experts, args.tokens, "bf16")
    # ep_bench dispatches with topk_idx and without weights, and combines without weights
    buffer_exchange = attrs.evolve(BUFFER_EXCHANGE, dispatch_weights=False)
    cfg = dict(tokens=args.tokens, hidden=args.hidden, topk=args.topk, experts=args.experts, rounds=args.rounds,
               warmup=args.warmup, fp8=False, backend="gloo")
    print(f"{'ranks':>5} {'what':>6} {'predicted ms':>12} {'measured ms median [min, max]':>32} {'min/pred':>8} "
          f"{'median/pred':>11}  bound by")
    for num_ranks in args.ranks:
        outcomes = run_ranks(num_ranks, ep_bench.bench_rank, (cfg,), timeout_s=1800)
        if not all(o.ok for o in outcomes):
            raise SystemExit("\n".join(o.describe() for o in outcomes))
        times = outcomes[0].value["times"]
        # the routing ep_bench drew on each rank (bench_rank: random_routing(..., seed=2000 + rank))
        ids = [random_routing(args.tokens, args.topk, args.experts, seed=2000 + r) for r in range(num_ranks)]
        costs = {what: estimate(shape, fabric, num_ranks, ids, exchange)
                 for what, exchange in (("raw", ROWS_ONLY), ("buffer", buffer_exchange))}
        # same bytes: ep_bench's payload (recv_x rows + the rows combined back, all ranks) is the model's count
        counted = float(costs["raw"].dispatch.traffic.counted.sum() + costs["raw"].combine.traffic.counted.sum())
        if counted != outcomes[0].value["payload_bytes"]:
            raise SystemExit(f"{num_ranks} ranks: ep_bench moved {outcomes[0].value['payload_bytes']:.0f} payload bytes,"
                             f" the model counts {counted:.0f}")
        for what, cost in costs.items():
            bound = max((p for c in (cost.dispatch, cost.combine) for p in c.phases), key=lambda p: p.seconds).bound
            measured = times[what]
            print(f"{num_ranks:>5} {what:>6} {cost.seconds * 1e3:>12.3f} {_spread(measured, 1e3):>32} "
                  f"{min(measured) / cost.seconds:>8.2f} {statistics.median(measured) / cost.seconds:>11.2f}  {bound}")
        own = statistics.median(b - r for b, r in zip(times["buffer"], times["raw"]))
        print(f"{'':>5} payload {counted / 1e6:.1f} MB (ep_bench's count = the model's); the Buffer's own work "
              f"(buffer - raw, median per round): {own * 1e3:.1f} ms")

if __name__ == "__main__":
    main()
