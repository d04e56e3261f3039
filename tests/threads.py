"""Running a test's work on several Python threads that switch as often as the interpreter allows
(between one thread's packing of a native call's arguments and its call too)."""

from __future__ import annotations

import sys
import threading
from typing import Callable


def run_interleaved(work: Callable[[int], None], count: int) -> None:
    """work(0) .. work(count - 1), each on its own thread, with a 1 µs switch interval."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
