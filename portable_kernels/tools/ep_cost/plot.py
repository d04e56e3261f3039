"""The picture of the cost model: time per MoE layer (dispatch + combine) against the EP degree,
one line per fabric, and the share of each rank's bytes that leaves the innermost tier.
matplotlib is an optional extra (`pip install portable-kernels[plot]`), imported only here."""

from __future__ import annotations

import pathlib
from typing import Any

from .fabric import US
from .model import LayerCost

PLOT_NAME = "ep_cost_time_per_layer.png"


def _figure() -> Any:
    try:
        import matplotlib  # noqa: F401  (Figure.savefig needs no pyplot backend)
    except ImportError as exc:
        raise ImportError("drawing the EP cost plot needs matplotlib: pip install 'portable-kernels[plot]'") from exc
    from matplotlib.figure import Figure
    return Figure


def plot_time_vs_ep(results: dict[str, list[LayerCost]], out_dir: str | pathlib.Path, title: str = "") -> pathlib.Path:
    """Write PLOT_NAME into out_dir (created if missing) and return its path."""
    Figure = _figure()
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(11, 4.2), dpi=120)
    time_ax, share_ax = fig.subplots(1, 2)
    markers, styles = "osD^v", ("-", "--", ":", "-.")
    for i, (name, costs) in enumerate(results.items()):
        if not costs:
            continue
        eps = [c.num_ranks for c in costs]
        # presets can coincide over a range (a two-tier pod equals its single tier below the domain
        # size): distinct line styles and shrinking markers keep every line visible
        style = dict(marker=markers[i % len(markers)], linestyle=styles[i % len(styles)], markersize=7 - 1.5 * i,
                     label=name)
        time_ax.plot(eps, [c.seconds / US / 1e3 for c in costs], **style)
        shares = []
        for c in costs:
            sent = float(c.dispatch.traffic.send.sum() + c.combine.traffic.send.sum())
            inner = float(c.dispatch.traffic.send[:, 0].sum() + c.combine.traffic.send[:, 0].sum())
            shares.append(100 * (1 - inner / sent) if sent else 0.0)
        share_ax.plot(eps, shares, **style)
    all_eps = sorted({c.num_ranks for costs in results.values() for c in costs})
    for ax in (time_ax, share_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_eps, [str(r) for r in all_eps])
        ax.set_xlabel("EP degree (ranks)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    time_ax.set_ylabel("lower-bound time per MoE layer (ms)")
    time_ax.set_title("dispatch + combine, slowest rank", fontsize=10)
    share_ax.set_ylabel("% of payload bytes beyond the innermost tier")
    share_ax.set_title("traffic leaving the scale-up domain", fontsize=10)
    share_ax.set_ylim(-2, 102)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = out / PLOT_NAME
    fig.savefig(path)
    return path
