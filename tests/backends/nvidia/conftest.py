"""The nvidia Triton kernels run here in Triton's interpreter on CPU tensors (no GPU in CI).

Triton decides compiled-vs-interpreted when a function is decorated, from its knob
`triton.knobs.runtime.interpret` (triton.language's own helpers when triton is imported, our kernels
when their module is). tests/conftest.py sets TRITON_INTERPRET=1, imports triton, pins the knob, then
removes the variable again — at its import, before any test module is collected (a module that runs
an op at collection imports the kernels), so the whole session interprets: the nvidia emulation elsewhere in the suite (tests/core/test_conformance.py) also
reaches the Triton providers. The knob is set in this process only — TRITON_INTERPRET is kept out
of the environment, so subprocesses the suite starts (CLI, demo, plugin tests) run as a user's
would: Triton compiled, so on CPU tensors the nvidia backend answers through its layout oracle
instead of interpreting DeepSeek-sized GEMMs. Without triton installed, every test here that needs
it is skipped with the reason.
"""

from __future__ import annotations

import os

import pytest

from portable_kernels.backends.nvidia.kernels import runtime

# the interpreter knob is pinned by tests/conftest.py, which pytest imports first
_MISSING = runtime.triton_missing_reason()


def pytest_collection_modifyitems(config, items):
    if _MISSING is None:
        return
    here = os.path.dirname(__file__)
    skip = pytest.mark.skip(reason=_MISSING)
    for item in items:
        if str(item.fspath).startswith(here) and getattr(item.module, "NEEDS_TRITON", True):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_reports(tmp_path_factory):
    """`python -m portable_kernels gpu-report --arch A --json FILE` for sm90 and sm100 (default configs),
    in two fresh compiled-mode processes at once (CI has two cores): every Triton kernel specimen
    compiled to a cubin and read back. {arch: (exit status, stdout, stderr, the JSON or None)};
    test_gpu_compile and test_gpu_report share this one run."""
    import json
    import subprocess
    import sys
    folder = tmp_path_factory.mktemp("gpu_report")
    env = {k: v for k, v in os.environ.items() if k != runtime.INTERPRET_ENV}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    procs = {arch: subprocess.Popen([sys.executable, "-m", "portable_kernels", "gpu-report", "--arch", arch,
                                     "--json", str(folder / f"{arch}.json")], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for arch in ("sm90", "sm100")}
    results = {}
    for arch, proc in procs.items():
        out, err = proc.communicate(timeout=900)
        path = folder / f"{arch}.json"
        results[arch] = (proc.returncode, out, err, json.loads(path.read_text()) if path.exists() else None)
    return results
