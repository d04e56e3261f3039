"""Drop-in for deepseek-ai/DeepEP: `from portable_kernels import deep_ep` replaces `import deep_ep`.

DeepEP's expert-parallel API (its legacy `Buffer`: normal and low-latency dispatch / combine,
`get_dispatch_layout`, events, `Config`, size hints) with DeepEP's constructor, method names,
argument order, defaults and return tuples — `portable_kernels.ops.ep.Buffer` over any
torch.distributed group (Gloo, NCCL, HCCL); docs/ep.md has its semantics and transport. Names of
DeepEP this port does not provide raise AttributeError with the reason (docs/porting.md).
"""

from __future__ import annotations

from ..ops.ep import Buffer, Config, EventHandle, EventOverlap, topk_idx_t
from . import utils

__all__ = ["Buffer", "Config", "EventHandle", "EventOverlap", "topk_idx_t", "utils"]

#: DeepEP names not provided here, and why
NOT_PROVIDED = {
    "ElasticBuffer": "DeepEP 2.x's ElasticBuffer (NCCL device API, layout computed inside dispatch) is not "
                     "implemented; use Buffer (docs/ep.md, 'DeepEP's ElasticBuffer')",
    "EPHandle": "the handle of ElasticBuffer, which is not implemented; Buffer returns DispatchHandle",
    "get_physical_domain_size": "NVLink / RDMA domain sizes of an NCCL communicator; the all-to-all transport "
                                "has no such split",
    "get_logical_domain_size": "scale-up / scale-out domain sizes of an NCCL communicator; the all-to-all "
                               "transport has no such split",
}


def __getattr__(name: str) -> object:
    if name in NOT_PROVIDED:
        raise AttributeError(f"portable_kernels.deep_ep.{name} is not provided: {NOT_PROVIDED[name]}")
    raise AttributeError(f"module 'portable_kernels.deep_ep' has no attribute {name!r}")
