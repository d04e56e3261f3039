"""The public ops as torch custom ops: `torch.ops.portable_kernels.<op>`, with a fake for each.

Importing this package (done by `import portable_kernels`) defines every op in the
`portable_kernels` namespace with torch.library — its schema (out arguments declared mutable),
its implementation (rebuilds prepared operands, calls the public function: registry, plan cache
and provider run inside) and its fake (output shapes, dtypes and strides without running) — and
registers each op's route in `portable_kernels.core.compiled`, which the public function calls under
torch.compile. docs/custom-ops.md has the schemas and the rules.
"""

# each module defines its family's ops and routes when imported
from . import ep, gemm, grouped_gemm, indexer, mhc, mla, moe_indices, moe_routing, prefill, quantization  # noqa: F401
from . import swiglu, topk  # noqa: F401
from .boundary import NAMESPACE, OPERAND_FIELDS, SCHEMAS, operand_args, rebuild_operand, register_provider_fake
from .fake_storage import register_fake_storage

__all__ = ["NAMESPACE", "OPERAND_FIELDS", "SCHEMAS", "operand_args", "rebuild_operand", "register_fake_storage",
           "register_provider_fake"]
