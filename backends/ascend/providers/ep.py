"""The ascend backend's expert-parallel engine: DeepEP's low-latency pair on CANN's MC2 collectives
(torch_npu's npu_moe_distribute_dispatch_v2 / combine_v2, ../vendor/mc2.py), offered to every
`ep.Buffer` whose group runs on HCCL where torch_npu imports. Checked against a stand-in only; not
run on an NPU."""

from __future__ import annotations

from typing import Any

from portable_kernels.core.registry import EpEngine, Registry

from ..vendor import mc2

NAME = "mc2"
PRIORITY = 10


def unavailable(group: Any) -> str | None:
    """Why the MC2 engine cannot serve `group` (None: it can)."""
    backend = mc2.group_backend(group)
    if "hccl" not in backend:
        return f"the group runs on {backend or 'an unnamed backend'}, not HCCL"
    if mc2.torch_npu_module() is None:
        return "torch_npu does not import here"
    return None


def build(buffer: Any) -> mc2.Mc2LowLatencyEngine:
    return mc2.Mc2LowLatencyEngine(buffer.group, buffer.transport, lambda: buffer.num_rdma_bytes, buffer._workspace)


def register(registry: Registry) -> None:
    registry.add_ep_engine(EpEngine(NAME, "ascend", build, unavailable, PRIORITY,
                                    doc="npu_moe_distribute_dispatch_v2 / combine_v2 on the group's HCCL "
                                        "communicator (checked against a stand-in; not run on an NPU)"))
