"""Plots of bench results: per family the ratio (peer time / op time) of every case as bars, and two
runs side by side per case.

matplotlib is optional (the `plot`/`bench` extras); it is imported only here, only when drawing,
and no pyplot state is touched (Figure objects are saved directly).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .report import backend_label, case_label, matched, run_label

Bar = tuple[float, float, float] | None  # median, min, max of a ratio


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _figure(title: str, subtitle: str, categories: list[str], series: dict[str, list[Bar]],
            targets: list[float | None], path: Path) -> Path:
    from matplotlib.figure import Figure

    n_series = max(1, len(series))
    height = 1.6 + 0.28 * len(categories) * n_series + 0.15 * len(categories)
    fig = Figure(figsize=(11, height), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    group = 0.8
    width = group / n_series
    values = [v for bars in series.values() for bar in bars if bar is not None for v in bar if v > 0]
    for s, (name, bars) in enumerate(series.items()):
        ys = [i - group / 2 + (s + 0.5) * width for i in range(len(categories))]
        shown = [(y, b) for y, b in zip(ys, bars) if b is not None]
        if not shown:
            continue
        med = [b[0] for _, b in shown]
        err = [[max(0.0, b[0] - b[1]) for _, b in shown], [max(0.0, b[2] - b[0]) for _, b in shown]]
        ax.barh([y for y, _ in shown], med, height=width * 0.9, xerr=err, capsize=2, label=name,
                error_kw={"elinewidth": 0.8})
        for (y, b) in shown:
            ax.text(b[2], y, f" {_num(b[0])}", va="center", fontsize=7)
    for i, target in enumerate(targets):
        if target is not None:
            ax.plot([target, target], [i - group / 2, i + group / 2], color="black", linewidth=1.6,
                    label="target" if i == next(j for j, t in enumerate(targets) if t is not None) else None)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=0.8)
    if values and max(values) / min(values) > 10:  # ratios spanning decades: a log axis keeps each readable
        ax.set_xscale("log")
    ax.set_yticks(range(len(categories)), categories, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("peer time / op time  (> 1: portable_kernels is faster; dashed: parity; bars: median, "
                  "whiskers: min-max of the rounds)", fontsize=8)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(subtitle, fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.savefig(path)
    return path


def _title(family: str) -> str:
    from .cases import FAMILIES
    module = FAMILIES.get(family)
    return getattr(module, "TITLE", "portable_kernels vs the torch code a user would write")


def _subtitle(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    load = "/".join(map(str, m["load_average"])) if m["load_average"] else "?"
    return f"{run_label(doc)}; {m['cpu']}, {m['cores']} cores, load {load}; {doc['settings']['size']} set"


def plot_families(doc: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """One PNG per family with measured cases: `<family>.png`, bars per case and (backend, threads)."""
    out = Path(out_dir)
    paths = []
    emulated = any(r["emulation"] for r in doc["cases"])
    for family in dict.fromkeys(r["family"] for r in doc["cases"]):
        records = [r for r in doc["cases"] if r["family"] == family and r["ratio"] is not None]
        if not records:
            continue
        categories = list(dict.fromkeys(case_label(r) for r in records))
        labels = list(categories)
        names = list(dict.fromkeys(f"{backend_label(r)} {r['threads']}t" for r in records))
        series: dict[str, list[Bar]] = {n: [None] * len(categories) for n in names}
        targets: list[float | None] = [None] * len(categories)
        for r in records:
            i = categories.index(case_label(r))
            x = r["ratio"]
            series[f"{backend_label(r)} {r['threads']}t"][i] = (x["median"], x["min"], x["max"])
            targets[i] = r["target"]
            if r["limit_us"] is not None:  # an absolute target: say it in the label, with the op's times
                op_us = f"{r['op_seconds']['median'] * 1e6:.0f}"
                labels[i] += (f" / {op_us} us" if "\n" in labels[i] else
                              f"\n(op <= {r['limit_us']:g} us wanted; {backend_label(r)}: {op_us} us")
        title = f"{family}: {_title(family)}"
        if emulated:
            title += "  (* = backend in emulation on CPU tensors: not that chip's times)"
        labels = [label + ")" if "\n" in label else label for label in labels]
        paths.append(_figure(title, _subtitle(doc), labels, series, targets, out / f"{family}.png"))
    return paths


def plot_compare(a: dict[str, Any], b: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """One PNG per family, `compare-<family>.png`: each case measured in both runs, A's bar beside B's."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pairs = matched(a, b)
    paths = []
    label_a, label_b = f"A {run_label(a)}", f"B {run_label(b)}"
    if label_a[2:] == label_b[2:]:
        label_a, label_b = "A", "B"
    for family in dict.fromkeys(ra["family"] for ra, _ in pairs):
        rows = [(ra, rb) for ra, rb in pairs if ra["family"] == family]
        categories = [f"{case_label(ra)} | {backend_label(ra)} {ra['threads']}t" for ra, _ in rows]
        series = {label_a: [(ra["ratio"]["median"], ra["ratio"]["min"], ra["ratio"]["max"]) for ra, _ in rows],
                  label_b: [(rb["ratio"]["median"], rb["ratio"]["min"], rb["ratio"]["max"]) for _, rb in rows]}
        subtitle = f"A: {_subtitle(a)}\nB: {_subtitle(b)}"
        paths.append(_figure(f"{family}: {_title(family)}, run A vs run B", subtitle, categories, series,
                             [ra["target"] for ra, _ in rows], out / f"compare-{family}.png"))
    return paths
