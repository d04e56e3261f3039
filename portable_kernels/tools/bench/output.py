"""Writes one bench run to a folder: the JSON record and the table (report.py), one plot per family
(plot.py, when matplotlib is installed). The one module that imports both, so neither imports the other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .plot import plot_families
from .report import JSON_NAME, TABLE_NAME, format_header, format_summary, format_table, write_json


def write_outputs(doc: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """bench.json, table.txt and, when matplotlib is installed, one PNG per family into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [write_json(doc, out / JSON_NAME)]
    table = out / TABLE_NAME
    table.write_text(f"{format_header(doc)}\n{format_table(doc)}\n{format_summary(doc)}\n")
    written.append(table)
    if has_matplotlib():
        written += plot_families(doc, out)
    return written


def has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
