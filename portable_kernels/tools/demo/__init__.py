"""`python -m portable_kernels demo`: one DeepSeek-V3-shaped MoE layer and one MLA decode step on
every backend that can run here (natively or in emulation), from the same model code, with the
weights prepared once per backend. Modules: `model` (the model code), `run` (per-backend runs),
`report` (the printout)."""

from .model import MlaShape, MoeShape, make_weights, moe_forward, prepare_weights
from .report import format_header, format_legend, format_providers, format_table, format_verdicts
from .run import MLA_BOUND, MOE_BOUND, BackendRun, run_demo, runnable_targets

__all__ = ["MLA_BOUND", "MOE_BOUND", "BackendRun", "MlaShape", "MoeShape", "format_header", "format_legend",
           "format_providers", "format_table", "format_verdicts", "make_weights", "moe_forward", "prepare_weights",
           "run_demo", "runnable_targets"]
