"""`deep_gemm.utils.dist`: DeepGEMM's process-group helpers for its multi-rank tests, on any
torch.distributed backend: NCCL where CUDA is present, Gloo on CPU (the same environment variables:
MASTER_ADDR, MASTER_PORT, WORLD_SIZE = nodes, RANK = node rank)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...core.checks import check_int
from ...core.harness import dist_print, join_process_group

__all__ = ["dist_print", "init_dist", "uneven_all_gather"]


def init_dist(local_rank: int, num_local_ranks: int) -> tuple[int, int, dist.ProcessGroup]:
    """Join the job as local rank `local_rank` of `num_local_ranks` on this node; returns (rank,
    world size, a group of every rank). CUDA: NCCL on device local_rank, which becomes the default
    device (as DeepGEMM); otherwise Gloo on CPU tensors."""
    check_int("init_dist", "num_local_ranks", num_local_ranks, 1)
    check_int("init_dist", "local_rank", local_rank, 0, num_local_ranks - 1,
              fix="pass the process's index on its node, 0..num_local_ranks-1")
    world = join_process_group(local_rank, num_local_ranks)
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(world)))


def uneven_all_gather(tensor: torch.Tensor, dim: int = 0, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Every rank's `tensor` concatenated along `dim` in rank order; the sizes along `dim` may differ
    between ranks (the other dims may not)."""
    sizes = [torch.zeros(1, dtype=torch.long, device=tensor.device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, torch.tensor([tensor.shape[dim]], dtype=torch.long, device=tensor.device), group=group)
    lengths = [int(s.item()) for s in sizes]
    shape = list(tensor.shape)
    shape[dim] = max(lengths)
    padded = tensor.new_zeros(shape)
    padded.narrow(dim, 0, tensor.shape[dim]).copy_(tensor)
    gathered = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(gathered, padded, group=group)
    return torch.cat([g.narrow(dim, 0, n) for g, n in zip(gathered, lengths)], dim=dim)
