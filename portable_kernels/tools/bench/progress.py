"""Progress on stderr: a tqdm bar when tqdm is installed, else one plain line per case.

tqdm is optional (the `bench` and `test` extras bring it); stdout stays free for the results.
"""

from __future__ import annotations

import sys
from typing import Any, Literal, TextIO

Mode = Literal["auto", "tqdm", "plain", "none"]


class Progress:
    """`start(label)` before a case, `done(summary)` after it; `close()` at the end."""

    def __init__(self, total: int, mode: Mode = "auto", stream: TextIO | None = None) -> None:
        self.total, self.count, self.stream = total, 0, stream or sys.stderr
        self._bar: Any = None
        self._label = ""
        if mode == "auto":
            mode = "tqdm" if _has_tqdm() else "plain"
        if mode == "tqdm":
            from tqdm import tqdm
            self._bar = tqdm(total=total, file=self.stream, unit="case", dynamic_ncols=True, leave=True)
        self.mode = mode

    def start(self, label: str) -> None:
        self._label = label
        if self._bar is not None:
            self._bar.set_description_str(label[:60])

    def done(self, summary: str) -> None:
        self.count += 1
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(summary[:40])
        elif self.mode == "plain":
            print(f"[{self.count}/{self.total}] {self._label}: {summary}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _has_tqdm() -> bool:
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True
