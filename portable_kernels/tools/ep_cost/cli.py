"""`python -m portable_kernels ep-cost`: the cost model from the command line.

    ep-cost [--preset ubl128] [--ep 64]            one layer's bytes and lower-bound time
    ep-cost --tier NVLink:8:160:1 --tier RDMA:*:50:1:3 --ep 16    a fabric of your own
    ep-cost --sweep                                 time per layer for every EP degree that fits
    ep-cost --plot DIR                              the sweep of every preset, drawn (needs matplotlib)
    ep-cost --check                                 the presets against DeepEP's published figures
    ep-cost --list                                  the presets and their sources

Bad input raises the library's typed errors; the CLI prints them as one line with exit status 2.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import torch

from ...core.errors import ContractError, format_problem
from .fabric import Fabric, custom_fabric, parse_tier
from .model import estimate
from .presets import MEASURED, PRESETS, PUBLISHED
from .report import check_published, format_layer, format_published, format_sweep, sweep
from .routing import RoutingSpec
from .shape import DEEPSEEK_V3, EXCHANGES, PAYLOADS, MoEShape


def add_parser(sub: Any, handler: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    p = sub.add_parser("ep-cost", help="bytes and lower-bound time of one MoE layer's EP dispatch + combine",
                       description="Bytes each rank sends and receives per dispatch and combine (per fabric tier) "
                                   "and the lower-bound time per MoE layer, from the routing get_dispatch_layout "
                                   "produces. See docs/ep-cost-model.md.")
    p.add_argument("--preset", default="nvlink8-rdma", choices=sorted(PRESETS) + sorted(MEASURED),
                   help="fabric (default nvlink8-rdma); gloo-2core is this project's CPU machine, measured")
    p.add_argument("--tier", action="append", metavar="NAME:RANKS:GBPS:LAT_US[:HOPS]",
                   help="a tier of your own fabric, innermost first (repeatable; replaces --preset); RANKS may be *")
    p.add_argument("--ep", type=int, default=8, help="EP degree: ranks in the expert-parallel group (default 8)")
    s = DEEPSEEK_V3
    p.add_argument("--hidden", type=int, default=s.hidden, help=f"hidden size (default {s.hidden})")
    p.add_argument("--topk", type=int, default=s.num_topk, help=f"experts per token (default {s.num_topk})")
    p.add_argument("--experts", type=int, default=s.num_experts, help=f"experts (default {s.num_experts})")
    p.add_argument("--tokens", type=int, default=s.tokens_per_rank, help=f"tokens per rank (default "
                                                                          f"{s.tokens_per_rank})")
    p.add_argument("--payload", default=s.payload, choices=PAYLOADS, help="dispatch payload (combine is bf16)")
    p.add_argument("--seed", type=int, default=0, help="routing draw (default 0)")
    p.add_argument("--skew", type=float, default=0.0, help="Zipf exponent of expert popularity (default 0: uniform)")
    p.add_argument("--groups", type=int, default=None, help="group-limited routing: expert groups")
    p.add_argument("--topk-groups", type=int, default=None, help="group-limited routing: groups per token")
    p.add_argument("--topk-idx", metavar="FILE", default=None,
                   help="routing of your own: a torch.save'd list of per-rank int64 [T, k] tensors (or one [R, T, k])")
    p.add_argument("--exchange", default="buffer", choices=sorted(EXCHANGES),
                   help="buffer: the Buffer's header + metadata + rows; rows: the token rows alone")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--sweep", action="store_true", help="time per layer at every EP degree that fits")
    what.add_argument("--plot", metavar="DIR", default=None, help="draw every preset's sweep into DIR (matplotlib)")
    what.add_argument("--check", action="store_true", help="compare the presets with published figures")
    what.add_argument("--list", action="store_true", help="list the presets and their sources")
    p.add_argument("--no-assumptions", action="store_true", help="do not print the list of assumptions")
    p.set_defaults(func=handler)
    return p


def _fabric(args: argparse.Namespace) -> Fabric:
    if args.tier:
        return custom_fabric([parse_tier(spec) for spec in args.tier])
    return {**PRESETS, **MEASURED}[args.preset]


def _routing(args: argparse.Namespace, shape: MoEShape) -> Any:
    if args.topk_idx is None:
        return RoutingSpec(seed=args.seed, skew=args.skew, groups=args.groups, topk_groups=args.topk_groups)
    loaded = torch.load(args.topk_idx, weights_only=True)
    if isinstance(loaded, torch.Tensor) and loaded.dim() == 3:
        loaded = list(loaded.unbind(0))
    if not isinstance(loaded, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in loaded):
        raise ContractError(format_problem("ep-cost", "--topk-idx", f"a file holding {type(loaded).__name__}",
                                           "a list of per-rank [T, k] tensors or one [R, T, k] tensor",
                                           "torch.save([ids_rank0, ids_rank1, ...], FILE)"))
    if len(loaded) != args.ep:
        raise ContractError(format_problem("ep-cost", "--ep", args.ep, f"{len(loaded)} (the ranks in --topk-idx)",
                                           "pass --ep equal to the number of ranks in the file"))
    return list(loaded)


def run(args: argparse.Namespace) -> int:
    if args.list:
        for fabric in [*PRESETS.values(), *MEASURED.values()]:
            print(fabric.describe())
            for source in fabric.sources:
                print(f"  source: {source}")
            print()
        return 0
    if args.check:
        print(format_published(check_published(PUBLISHED)))
        return 0
    shape = MoEShape(args.hidden, args.topk, args.experts, args.tokens, args.payload)
    exchange = EXCHANGES[args.exchange]
    routing = _routing(args, shape)
    if args.plot is not None:
        from .plot import plot_time_vs_ep
        fabrics = list(PRESETS.values()) + ([_fabric(args)] if args.tier else [])
        results = sweep(shape, fabrics, routing, exchange)
        print(format_sweep(results))
        print(plot_time_vs_ep(results, args.plot, f"{shape.describe()}; routing {routing.describe()}"))
        return 0
    fabric = _fabric(args)
    if args.sweep:
        print(format_sweep(sweep(shape, [fabric], routing, exchange)))
        return 0
    print(format_layer(estimate(shape, fabric, args.ep, routing, exchange), assumptions=not args.no_assumptions))
    return 0
