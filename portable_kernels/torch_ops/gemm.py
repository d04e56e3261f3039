"""Custom ops of the dense GEMMs: fp8_gemm_nt, bf16_gemm_nt, fp8_fp4_gemm_nt and the nn / tn / tt
layouts of the FP8 and bf16 GEMMs (transposed operands in the form the caller stores them), and
tf32_hc_prenorm_gemm (writes d and sqr_sum).

Each writes `d` in place and returns nothing (`Tensor(d!) d`, as DeepGEMM's calls do); quantized
operands cross as `boundary.OPERAND_FIELDS`. Schema, route and implementation come from each public
function's signature (`declare.custom_op`); the fakes have nothing to allocate.
"""

from __future__ import annotations

from ..ops.gemm import dense, fp4, hc_prenorm, transposed
from .declare import custom_op

for _public in (dense.fp8_gemm_nt, dense.bf16_gemm_nt, fp4.fp8_fp4_gemm_nt,
                *(getattr(transposed, f"{kind}_gemm_{layout}") for kind in ("fp8", "bf16")
                  for layout in transposed.LAYOUTS)):
    custom_op(_public, writes=("d",))

custom_op(hc_prenorm.tf32_hc_prenorm_gemm, writes=("d", "sqr_sum"))
