"""pytest plugin for an upstream pytest suite: wrap every test in the backend, record outcomes.

Configured by the environment the engine sets: PK_UPSTREAM_BACKEND (spec), PK_UPSTREAM_RESULTS
(a JSON-lines file), PK_UPSTREAM_TIMEOUT (seconds per test), PK_UPSTREAM_SAMPLE (keep at most
that many parametrizations of each test function, a random sample seeded by the
function's node id; 0 keeps all).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from . import cuda_stubs
from .engine import Backend

cuda_stubs.install()

_outcomes: dict[str, dict] = {}


def _write(row: dict) -> None:
    with open(os.environ["PK_UPSTREAM_RESULTS"], "a") as f:
        f.write(json.dumps(row) + "\n")


def _first_line(report) -> str:
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, message)
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def pytest_collection_modifyitems(config, items):
    sample = int(os.environ.get("PK_UPSTREAM_SAMPLE", "0"))
    if sample <= 0:
        return
    groups: dict[tuple[str, str], list] = {}
    for item in items:
        groups.setdefault((str(item.path), getattr(item, "originalname", item.name)), []).append(item)
    keep, dropped = [], []
    for group in groups.values():
        if len(group) <= sample:
            keep += group
            continue
        picked = set(random.Random(group[0].nodeid.split("[")[0]).sample(range(len(group)), sample))
        keep += [it for i, it in enumerate(group) if i in picked]
        dropped += [it for i, it in enumerate(group) if i not in picked]
    items[:] = keep
    config.hook.pytest_deselected(items=dropped)


def pytest_collectreport(report):
    if report.failed:
        _write({"file": Path(report.nodeid.split("::")[0]).as_posix(), "name": "<collect>",
                "outcome": "failed", "first_line": _first_line(report)})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    timeout = int(os.environ.get("PK_UPSTREAM_TIMEOUT", "0"))

    def _alarm(signum, frame):
        raise TimeoutError(f"over the per-test limit of {timeout} s on this machine")

    if timeout:
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(timeout)
    try:
        with Backend.parse(os.environ["PK_UPSTREAM_BACKEND"]).context():
            yield
    finally:
        signal.alarm(0)


def pytest_runtest_logreport(report):
    file, _, name = report.nodeid.partition("::")
    row = _outcomes.setdefault(report.nodeid, {"file": file, "name": name, "outcome": "passed",
                                               "first_line": "", "seconds": 0.0, "start": time.monotonic()})
    row["seconds"] += report.duration
    if report.failed and row["outcome"] != "failed":
        row["outcome"], row["first_line"] = "failed", f"[{report.when}] " * (report.when != "call") + _first_line(report)
    elif report.skipped and row["outcome"] == "passed":
        row["outcome"], row["reason"] = "skipped", _first_line(report)
    if report.when == "teardown":
        row.pop("start")
        row["seconds"] = round(row["seconds"], 2)
        _write(row)
