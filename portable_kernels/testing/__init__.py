"""The conformance kit: each op family's contract cases, runnable against any backend.

`run_conformance(backend=None, ops=None, quick=False)` returns a ConformanceReport; the CLI is
`python -m portable_kernels conformance [--backend NAME] [--quick]`. Case modules register
themselves on import, one module per op family (`<family>_cases.py`).
"""

import importlib
import pkgutil

from .core import Case, CaseFailure, ConformanceReport, OpReport, cases_for, conformance_cases, run_conformance

for _info in pkgutil.iter_modules(__path__):
    if _info.name.endswith("_cases"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["Case", "CaseFailure", "ConformanceReport", "OpReport", "cases_for", "conformance_cases",
           "run_conformance"]
