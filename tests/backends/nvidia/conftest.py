"""The nvidia Triton kernels run here in Triton's interpreter on CPU tensors (no GPU in CI).

Triton decides compiled-vs-interpreted when a function is decorated, from its knob
`triton.knobs.runtime.interpret` (triton.language's own helpers when triton is imported, our kernels
when their module is). This conftest sets TRITON_INTERPRET=1, imports triton, pins the knob, then
removes the variable again — all at its import, before any test module imports a kernel. pytest imports every conftest while collecting, so in a full run the whole
session interprets: the nvidia emulation elsewhere in the suite (tests/core/test_conformance.py) also
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

# triton.language's own helpers are decorated when triton is imported: the variable must be set first
os.environ[runtime.INTERPRET_ENV] = "1"
_MISSING = runtime.triton_missing_reason()  # imports triton if it is installed
if _MISSING is None:
    import triton

    triton.knobs.runtime.interpret = True  # held by the knob itself from now on, in this process only
os.environ.pop(runtime.INTERPRET_ENV, None)  # subprocesses start without it


def pytest_collection_modifyitems(config, items):
    if _MISSING is None:
        return
    here = os.path.dirname(__file__)
    skip = pytest.mark.skip(reason=_MISSING)
    for item in items:
        if str(item.fspath).startswith(here) and getattr(item.module, "NEEDS_TRITON", True):
            item.add_marker(skip)
