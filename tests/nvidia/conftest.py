"""The nvidia Triton kernels run here in Triton's interpreter on CPU tensors (no GPU in CI).

Triton decides compiled-vs-interpreted when a kernel module is decorated, so TRITON_INTERPRET is
set at the import of this conftest, before any test module imports a kernel. pytest imports every
conftest while collecting, so in a full run the variable is set for the whole session: the nvidia
emulation runs elsewhere in the suite (tests/test_conformance.py) then also reach the Triton
providers. Without triton installed, every test here is skipped with the reason.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

from portable_kernels.backends.nvidia.kernels import runtime  # noqa: E402  (after the variable is set)

_MISSING = runtime.triton_missing_reason()


def pytest_collection_modifyitems(config, items):
    if _MISSING is None:
        return
    here = os.path.dirname(__file__)
    skip = pytest.mark.skip(reason=_MISSING)
    for item in items:
        if str(item.fspath).startswith(here) and getattr(item.module, "NEEDS_TRITON", True):
            item.add_marker(skip)
