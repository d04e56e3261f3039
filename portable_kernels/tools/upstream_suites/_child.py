"""Child process of a script-style upstream file: call its test_* functions under one backend.

argv: FILE BACKEND_SPEC RESULTS_JSON TEST_TIMEOUT_S. Each function runs seeded as the upstream
`__main__` block seeds (torch and random at 0), inside use_backend, under an alarm.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import random
import signal
import sys
import time
import traceback
from pathlib import Path

from . import cuda_stubs
from .engine import Backend, first_line


class TestTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise TestTimeout(f"over the per-test limit of {int(sys.argv[4])} s on this machine")


def load_module(file: Path):
    """Import an upstream file as its own top-level module, its folder first on sys.path."""
    sys.path.insert(0, str(file.parent))
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[file.stem] = module
    module_spec.loader.exec_module(module)
    return module


def run_timed(name: str, spec: str, backend: Backend, timeout: int, call) -> dict:
    """One test's result row: `call()` under the backend and an alarm (the caller installs the
    SIGALRM handler); it returns None when passed, else the failure's first line."""
    row = {"name": name, "outcome": "passed", "first_line": ""}
    print(f"### {name} [{spec}]", flush=True)
    start = time.monotonic()
    signal.alarm(timeout)
    try:
        with backend.context():
            failure = call()
        if failure:
            row |= {"outcome": "failed", "first_line": failure}
    except BaseException as exc:
        traceback.print_exc()
        row |= {"outcome": "failed", "first_line": first_line(exc)}
    finally:
        signal.alarm(0)
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


def main() -> None:
    file, spec, out, timeout = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    cuda_stubs.install()
    import torch

    backend = Backend.parse(spec)
    rows = []

    def write():
        out.write_text(json.dumps(rows, indent=1))

    try:
        module = load_module(file)
    except BaseException as exc:  # an import failure is the file's one result
        traceback.print_exc()
        rows.append({"name": "<import>", "outcome": "failed", "first_line": first_line(exc)})
        write()
        return
    tests = [f for n, f in vars(module).items()
             if n.startswith("test_") and inspect.isfunction(f) and f.__module__ == module.__name__]
    tests.sort(key=lambda f: f.__code__.co_firstlineno)
    if not tests:
        rows.append({"name": "<file>", "outcome": "skipped", "first_line": "",
                     "reason": "no top-level test_* function (script body only)"})
    signal.signal(signal.SIGALRM, _alarm)
    for fn in tests:
        torch.manual_seed(0)
        random.seed(0)
        rows.append(run_timed(fn.__name__, spec, backend, timeout, fn))
        write()
    write()


if __name__ == "__main__":
    main()
