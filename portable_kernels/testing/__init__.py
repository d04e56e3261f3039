"""The conformance kit: each op family's contract cases, runnable against any backend.

`run_conformance(backend=None, ops=None, quick=False)` returns a ConformanceReport; the CLI is
`python -m portable_kernels conformance [--backend NAME] [--quick]`. Case modules register
themselves on import, one module per op family (`<family>_cases.py`).
"""

from . import gemm_cases, quantization_cases  # noqa: F401  (registers cases)
from .core import Case, CaseFailure, ConformanceReport, OpReport, cases_for, conformance_cases, run_conformance

__all__ = ["Case", "CaseFailure", "ConformanceReport", "OpReport", "cases_for", "conformance_cases",
           "run_conformance"]
