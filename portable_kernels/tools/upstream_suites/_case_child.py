"""Child process of a case-list upstream file (cases.py): enumerate, sample, run under one backend.

argv: FILE BACKEND_SPEC RESULTS_JSON TEST_TIMEOUT_S DRIVERS_MODULE SAMPLE. DRIVERS_MODULE is the
runner module whose DRIVERS maps the file's name to its CaseDriver.
"""

from __future__ import annotations

import importlib
import json
import signal
import sys
import traceback
from pathlib import Path

from . import cuda_stubs
from ._child import load_module, run_timed
from .cases import collect, pick, with_seed
from .engine import Backend, first_line


def main() -> None:
    file, spec, out, timeout = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    drivers, sample = importlib.import_module(sys.argv[5]).DRIVERS, int(sys.argv[6])
    cuda_stubs.install()
    import torch

    backend = Backend.parse(spec)
    driver = drivers[file.name]
    rows: list[dict] = []

    def write():
        out.write_text(json.dumps(rows, indent=1))

    try:
        module = load_module(file)
        with backend.context():
            cases = collect(module, driver)
    except BaseException as exc:  # an import or enumeration failure is the file's one result
        traceback.print_exc()
        rows.append({"name": "<enumerate>", "outcome": "failed", "first_line": first_line(exc)})
        write()
        return
    chosen, over = pick(cases, driver, sample, seed=file.name)
    left = len(cases) - len(chosen)
    if left:
        rows.append({"name": "<not run>", "outcome": "skipped", "first_line": "",
                     "reason": f"{left} of {len(cases)} cases not run: {over} over the CPU size cap of "
                               f"{driver.max_cost:.0e} elements, {left - over} not in the sample of {sample}"})
    fn = getattr(module, driver.function)

    def _alarm(signum, frame):
        raise TimeoutError(f"over the per-case limit of {timeout} s on this machine")

    signal.signal(signal.SIGALRM, _alarm)
    for case in chosen:
        args = driver.prepare(with_seed(case.args, case.index))
        name = f"{driver.function}[{case.index}] {driver.label(args)}".strip()
        torch.set_default_dtype(case.default_dtype)
        vars(module).update(case.module_globals)

        def call(args=args, case=case):
            result = fn(*args, **case.kwargs)
            return None if driver.passed(result) else f"the case reports incorrect results ({result!r})"[:300]

        rows.append(run_timed(name, spec, backend, timeout, call))
        write()
    write()


if __name__ == "__main__":
    main()
