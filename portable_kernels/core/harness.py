"""What the drop-ins' test-utility modules (deep_gemm.testing / .utils.dist, deep_ep.utils,
tile_kernels.testing) have in common, written once: byte counts of (nested) tensors, silencing a
block's output, and joining a process group from the upstream libraries' environment variables
(MASTER_ADDR, MASTER_PORT, WORLD_SIZE = nodes, RANK = node rank) — NCCL with CUDA, Gloo otherwise."""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

__all__ = ["count_bytes", "dist_print", "empty_suppress", "join_process_group", "suppress_stdout_stderr"]

_local_rank: list[int] = []


def count_bytes(*tensors: Any) -> int:
    """Bytes of every tensor given; tuples, lists and (data, scale) pairs such as QuantTensors are
    walked, None counts 0."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
        else:
            total += count_bytes(*t)
    return total


class empty_suppress:
    """A context manager that suppresses nothing (what a test uses when output should show)."""

    def __enter__(self) -> "empty_suppress":
        return self

    def __exit__(self, *_: Any) -> None:
        return None


class suppress_stdout_stderr:
    """Send everything written to stdout and stderr inside the block to the null device: Python's
    sys.stdout / sys.stderr and the process's descriptors 1 and 2, so native libraries go quiet too."""

    def __enter__(self) -> "suppress_stdout_stderr":
        sys.stdout.flush()
        sys.stderr.flush()
        self._null = open(os.devnull, "w")
        self._streams = (sys.stdout, sys.stderr)
        self._fds = (self._streams[0].fileno(), self._streams[1].fileno())
        self._saved = tuple(os.dup(fd) for fd in self._fds)
        for fd in self._fds:
            os.dup2(self._null.fileno(), fd)
        sys.stdout = sys.stderr = self._null
        return self

    def __exit__(self, *_: Any) -> None:
        sys.stdout, sys.stderr = self._streams
        for fd, saved in zip(self._fds, self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        self._null.close()


def join_process_group(local_rank: int, num_local_ranks: int) -> int:
    """Initialise the default process group as local rank `local_rank` of `num_local_ranks` on this
    node (NCCL on device local_rank, which becomes the default device, with CUDA; Gloo otherwise);
    returns the world size. The caller checks its own arguments first."""
    import torch.distributed as dist

    _local_rank[:] = [local_rank]
    num_nodes = int(os.getenv("WORLD_SIZE", "1"))
    node_rank = int(os.getenv("RANK", "0"))
    address = f"tcp://{os.getenv('MASTER_ADDR', '127.0.0.1')}:{int(os.getenv('MASTER_PORT', '8361'))}"
    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo", init_method=address,
                            world_size=num_nodes * num_local_ranks, rank=node_rank * num_local_ranks + local_rank)
    if cuda:
        torch.cuda.set_device(local_rank)
        torch.set_default_device("cuda")
    return num_nodes * num_local_ranks


def dist_print(s: str = "", once_in_node: bool = False) -> None:
    """Print (every local rank, or only local rank 0 with once_in_node), then wait for every rank."""
    import torch.distributed as dist

    if not _local_rank:
        raise RuntimeError("dist_print: call init_dist first (it records this process's local rank)")
    if not once_in_node or _local_rank[0] == 0:
        print(s, flush=True)
    dist.barrier()
