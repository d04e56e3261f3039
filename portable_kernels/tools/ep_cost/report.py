"""Text output of the cost model: one layer's bytes and times, a sweep over EP degrees, and the
check against published figures. Plain strings; the CLI prints them."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

from .fabric import GB, US, Fabric
from .model import ASSUMPTIONS, LayerCost, estimate, layer_counts
from .presets import PRESETS, PublishedFigure
from .routing import RoutingSpec
from .shape import BUFFER_EXCHANGE, Exchange, MoEShape
from .traffic import CALLS

MB = 1e6


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    rows = [list(r) for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return [fmt.format(*header)] + [fmt.format(*r) for r in rows]


def _mean_max(values) -> str:
    return f"{float(values.mean()) / MB:.2f} / {float(values.max()) / MB:.2f}"


def format_layer(cost: LayerCost, assumptions: bool = True) -> str:
    shape, fabric, counts = cost.shape, cost.fabric, cost.counts
    lines = [fabric.describe(), f"model: {shape.describe()}",
             f"EP degree {cost.num_ranks}, routing {cost.routing}: {counts.ranks_per_token:.2f} ranks per token, "
             f"busiest expert {counts.expert_imbalance:.2f}x the mean, busiest rank receives "
             f"{counts.recv_imbalance:.2f}x the mean",
             f"exchange: {cost.exchange.name} (header {'yes' if cost.exchange.header else 'no'}, metadata "
             f"{'yes' if cost.exchange.metadata else 'no'})", "",
             "bytes per rank per call, MB (1e6 B), mean / max over ranks:"]
    tier_names = [t.name for t in fabric.tiers]
    rows = []
    for kind in CALLS:
        traffic = cost.call(kind).traffic
        for direction, payload, header in (("send", traffic.send, traffic.header_send),
                                           ("recv", traffic.recv, traffic.header_recv)):
            rows.append([kind, direction, *[_mean_max(payload[:, t]) for t in range(len(tier_names))],
                         _mean_max(traffic.local), f"{float(header.sum(dim=1).max()) / 1e3:.2f}"])
    lines += _table(["call", "dir", *tier_names, "kept (self)", "header kB"], rows)
    lines.append("DeepEP-counted bytes per rank (recv_x rows, own included): " + ", ".join(
        f"{kind} {_mean_max(cost.call(kind).traffic.counted)} MB" for kind in CALLS))
    lines += ["", "time lower bound, slowest rank (us):"]
    rows = []
    for kind in CALLS:
        call = cost.call(kind)
        phases = {p.name: p for p in call.phases}
        header = f"{phases['header'].seconds / US:.1f}" if "header" in phases else "-"
        payload = phases["payload"]
        rows.append([kind, header, f"{payload.seconds / US:.1f}", f"{call.seconds / US:.1f}",
                     f"{call.counted_bandwidth / GB:.1f}", payload.bound])
    rows.append(["layer", "", "", f"{cost.seconds / US:.1f}", "", "dispatch + combine"])
    lines += _table(["call", "header", "payload", "total", "DeepEP GB/s", "bound by"], rows)
    if assumptions:
        lines += ["", "assumptions:"] + [f"  - {a}" for a in ASSUMPTIONS]
    return "\n".join(lines)


def default_ep_degrees(shape: MoEShape, fabric: Fabric, smallest: int = 8) -> list[int]:
    """Powers of two from `smallest` up to the experts (each rank needs one) and the fabric's size."""
    largest = shape.num_experts if fabric.max_ranks is None else min(shape.num_experts, fabric.max_ranks)
    out, r = [], smallest
    while r <= largest:
        if shape.num_experts % r == 0:
            out.append(r)
        r *= 2
    return out


def sweep(shape: MoEShape, fabrics: Sequence[Fabric], routing: RoutingSpec = RoutingSpec(),
          exchange: Exchange = BUFFER_EXCHANGE, ep_degrees: Optional[Sequence[int]] = None
          ) -> dict[str, list[LayerCost]]:
    """One estimate per (fabric, EP degree); the routing of each EP degree is drawn once and shared."""
    degrees = sorted(set(ep_degrees or [r for f in fabrics for r in default_ep_degrees(shape, f)]))
    out: dict[str, list[LayerCost]] = {f.name: [] for f in fabrics}
    for r in degrees:
        fits = [f for f in fabrics if f.max_ranks is None or r <= f.max_ranks]
        if not fits:
            continue
        counts = layer_counts(shape, r, routing)
        for fabric in fits:
            out[fabric.name].append(estimate(shape, fabric, r, routing, exchange, counts=counts))
    return out


def format_sweep(results: dict[str, list[LayerCost]]) -> str:
    rows = []
    for name, costs in results.items():
        for c in costs:
            outer = c.fabric.tiers[-1]
            sent = c.dispatch.traffic.send.sum() + c.combine.traffic.send.sum()
            share = float((c.dispatch.traffic.send[:, -1].sum() + c.combine.traffic.send[:, -1].sum()) / sent) \
                if sent > 0 else 0.0
            rows.append([name, str(c.num_ranks), f"{c.dispatch.seconds / US:.1f}", f"{c.combine.seconds / US:.1f}",
                         f"{c.seconds / US:.1f}", f"{c.counts.ranks_per_token:.2f}",
                         f"{100 * share:.0f}% {outer.name}" if len(c.fabric.tiers) > 1 else "-"])
    return "\n".join(_table(["fabric", "EP", "dispatch us", "combine us", "layer us", "ranks/token",
                             "bytes on outer tier"], rows))


def check_published(figures: Sequence[PublishedFigure]) -> list[tuple[PublishedFigure, LayerCost]]:
    """The model's estimate for each published figure's setup (its fabric preset, EP degree, shape,
    routing and exchange)."""
    return [(f, estimate(f.shape, PRESETS[f.fabric], f.num_ranks, f.routing, f.exchange)) for f in figures]


def format_published(checked: Sequence[tuple[PublishedFigure, LayerCost]]) -> str:
    rows = []
    for fig, cost in checked:
        for kind, published in (("dispatch", fig.dispatch_gbps), ("combine", fig.combine_gbps)):
            bound = cost.call(kind).counted_bandwidth / GB
            rows.append([fig.name, fig.status, f"{fig.fabric} EP{fig.num_ranks} {fig.exchange.name}", kind,
                         f"{published:.0f}",
                         f"{bound:.1f}", f"{published / bound:.2f}"])
    lines = _table(["figure", "status", "preset, exchange", "call", "published GB/s", "model bound GB/s", "published/bound"],
                   rows)
    lines.append("")
    seen = set()
    for fig, _ in checked:
        text = f"{fig.source}" + (f" ({fig.note})" if fig.note else "")
        lines.append(f"{fig.name}: " + ("see above" if text in seen else text))
        seen.add(text)
    return "\n".join(lines)
