"""Reading and writing bench results: the text table, the JSON document, and comparing two runs.

Rule: the JSON document is the record (every field, every round's sample); the table and plots are
drawn from it, so a committed JSON can always be drawn again (`--compare` reads two of them).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .runner import SCHEMA, BenchUsageError

JSON_NAME = "bench.json"
TABLE_NAME = "table.txt"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def _spread(x: dict[str, Any] | None, ratio: bool = False) -> str:
    if x is None:
        return "-"
    if ratio:
        return f"{x['median']:.2f} ({x['min']:.2f}-{x['max']:.2f})"
    return f"{fmt_seconds(x['median'])} ({fmt_seconds(x['min'])}-{fmt_seconds(x['max'])})"


def _mib(x: float | None) -> str:
    return "?" if x is None else f"{x:.0f} MiB"


def target_label(r: dict[str, Any]) -> str:
    parts = []
    if r["target"] is not None:
        parts.append(f">={r['target']:g}x")
    if r["limit_us"] is not None:
        parts.append(f"<={r['limit_us']:g}us")
    return " ".join(parts) or "-"


def backend_label(r: dict[str, Any]) -> str:
    """The backend with its options, * when emulated; "none (device)" for a family that calls none."""
    name = r["backend"] or f"none ({r['device']})"
    if r["options"]:
        name += "[" + ",".join(f"{k}={v}" for k, v in sorted(r["options"].items())) + "]"
    return name + ("*" if r["emulation"] else "")


def case_label(r: dict[str, Any]) -> str:
    return f"{r['case']} {r['shape']}"


def format_header(doc: dict[str, Any]) -> str:
    m, v, s = doc["machine"], doc["versions"], doc["settings"]
    commit = (v["git_commit"] or "unknown")[:10] + (" (dirty)" if v.get("git_dirty") else "")
    load = m["load_average"]
    end = m.get("load_average_end")
    return (f"bench {doc['date']}: {m['cpu']}, {m['cores']} cores ({m['cores_usable']} usable), {m['os']}; load "
            f"{load if load is None else '/'.join(map(str, load))} at start"
            + (f", {'/'.join(map(str, end))} at end" if end else "") +
            f"; torch {v['torch']}, portable_kernels {v['portable_kernels']} {commit}; {s['size']} set, "
            f"{s['rounds']} rounds, threads {','.join(map(str, s['threads']))}"
            + "".join(f", {k}={v}" for k, v in (m.get("openmp_wait") or {}).items() if v))


def format_table(doc: dict[str, Any]) -> str:
    """The results, one line per case: medians (min-max) of op and peer, the ratio, target and provider."""
    rows = [("family", "case", "backend", "thr", "op (min-max)", "peer (min-max)", "ratio peer/op", "target",
             "met", "provider")]
    for r in doc["cases"]:
        if r["skipped"] or r["error"]:
            why = f"skipped: {r['skipped']}" if r["skipped"] else f"ERROR: {r['error']}"
            rows.append((r["family"], case_label(r), backend_label(r), str(r["threads"]), why, "", "", "", "", ""))
            continue
        met = {True: "met", False: "MISSED", None: ""}[r["met"]]
        notes = [r["note"]] if r.get("note") else []
        if r.get("peak_mib"):
            notes.append(f"peak memory growth op {_mib(r['peak_mib']['op'])}, peer {_mib(r['peak_mib']['peer'])}")
        rows.append((r["family"], case_label(r), backend_label(r), str(r["threads"]), _spread(r["op_seconds"]),
                     _spread(r["peer_seconds"]), _spread(r["ratio"], ratio=True), target_label(r), met,
                     (r["provider"] or "-") + "".join(f" [{n}]" for n in notes)))
    notes = {i for i, row in enumerate(rows) if i and not row[5]}  # skipped: the reason runs to the end
    widths = [max(len(row[c]) for i, row in enumerate(rows) if i not in notes or c < 4) for c in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        if i in notes:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
        else:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def format_summary(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    text = (f"{s['measured']} of {s['cases']} cases measured ({s['skipped']} skipped, {s['errors']} errors); "
            f"targets met {s['met']} of {s['with_target']}")
    if s["emulated"]:
        text += (f"; {s['emulated']} cases ran a backend in emulation on CPU tensors (marked *): their times "
                 "are not that chip's")
    return text + ". ratio = peer time / op time (> 1: the library is faster); medians of paired rounds."


def _finite(x: Any) -> Any:
    """JSON has no NaN/Inf: they become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write_json(doc: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(_finite(doc), indent=1, allow_nan=False) + "\n")
    return path


def load_run(path: str | Path) -> dict[str, Any]:
    """A bench document from a JSON file (BenchUsageError when it is not one)."""
    p = Path(path)
    if p.is_dir():
        p = p / JSON_NAME
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise BenchUsageError(f"{p} is not JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith(SCHEMA.split("/")[0] + "/"):
        raise BenchUsageError(f"{p} is not a bench result (no schema {SCHEMA!r}); write one with "
                              "`python -m portable_kernels bench --out DIR`")
    return doc


def case_key(r: dict[str, Any]) -> tuple:
    return (r["family"], r["case"], r["shape"], r["backend"], tuple(sorted(r["options"].items())), r["threads"])


def run_label(doc: dict[str, Any]) -> str:
    commit = (doc["versions"].get("git_commit") or "")[:8]
    return f"{doc['date'][:16]} {commit}".strip()


def matched(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Cases measured in both runs, in a's order."""
    by_key = {case_key(r): r for r in b["cases"] if r["ratio"] is not None}
    return [(r, by_key[case_key(r)]) for r in a["cases"] if r["ratio"] is not None and case_key(r) in by_key]


def format_compare(a: dict[str, Any], b: dict[str, Any]) -> str:
    pairs = matched(a, b)
    rows = [("family", "case", "backend", "thr", "ratio A", "ratio B", "op A", "op B", "op B/A")]
    for ra, rb in pairs:
        rows.append((ra["family"], case_label(ra), backend_label(ra), str(ra["threads"]),
                     f"{ra['ratio']['median']:.2f}", f"{rb['ratio']['median']:.2f}", fmt_seconds(ra["op_seconds"]["median"]),
                     fmt_seconds(rb["op_seconds"]["median"]),
                     f"{rb['op_seconds']['median'] / ra['op_seconds']['median']:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(0, f"A = {run_label(a)} ({a['machine']['cpu']}); B = {run_label(b)} ({b['machine']['cpu']})")
    lines.append(f"{len(pairs)} cases in both runs ({len(a['cases'])} in A, {len(b['cases'])} in B); "
                 "op B/A < 1: B's op is faster")
    return "\n".join(lines)
