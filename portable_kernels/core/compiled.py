"""Where the public ops go under torch.compile: one `torch.ops.portable_kernels.*` call each.

Every public op starts with

    if is_compiling():
        return compiled_call("fp8_gemm_nt", a, b, d, c, recipe)

so that while torch.compile (or torch.export) traces it, dynamo follows `compiled_call` into the
op's *route* (`portable_kernels.torch_ops`), which flattens prepared operands into tensors plus
static attributes and calls the registered custom op: the graph gets one node, and the registry
and plan cache run inside the op when the graph runs. In eager mode the check costs one function
call and the op keeps its direct Python path. The routes register themselves here when
`portable_kernels.torch_ops` is imported (at the end of `import portable_kernels`).
"""

from __future__ import annotations

from typing import Any, Callable

from torch.compiler import is_compiling

__all__ = ["ROUTES", "compiled_call", "is_compiling"]

#: op name -> its route: same signature as the public function, calls torch.ops.portable_kernels.<op>
ROUTES: dict[str, Callable[..., Any]] = {}


def compiled_call(op: str, *args: Any, **kwargs: Any) -> Any:
    """Run public op `op` through its torch.library custom op (what a traced public call becomes)."""
    return ROUTES[op](*args, **kwargs)
