"""Rules every upstream suite shares: the CUDA device string mapped to the CPU, and the
failures that need hardware no drop-in can provide."""

from __future__ import annotations

from .engine import HardwareRule, Rule

DEVICE_RULES = (
    Rule(r"""(['"])cuda\1""", r"\1cpu\1", "tensors are made on the CPU, where the drop-ins run"),
    Rule(r"\.cuda\(\)", ".cpu()", "tensors are made on the CPU, where the drop-ins run", required=False),
)

HARDWARE = (
    HardwareRule(r"(?i)nvshmem", "NVSHMEM (GPU-initiated communication between GPUs)"),
    HardwareRule(r"(?i)cuda ?graph", "CUDA graphs"),
    HardwareRule(r"(?i)compute-sanitizer", "compute-sanitizer runs CUDA binaries"),
    HardwareRule(r"(?i)kineto|profiler.*kernel name", "kernel-name profiling of CUDA kernels"),
    HardwareRule(r"(?i)NCCL|init_process_group|world_size", "several GPUs in a process group"),
)
