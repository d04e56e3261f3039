"""`deep_gemm.utils.dist`: DeepGEMM's process-group helpers for its multi-rank tests, on any
torch.distributed backend: NCCL where CUDA is present, Gloo on CPU (the same environment variables:
MASTER_ADDR, MASTER_PORT, WORLD_SIZE = nodes, RANK = node rank)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ...core.checks import check_int

__all__ = ["dist_print", "init_dist", "uneven_all_gather"]

_local_rank: int | None = None


def init_dist(local_rank: int, num_local_ranks: int) -> tuple[int, int, dist.ProcessGroup]:
    """Join the job as local rank `local_rank` of `num_local_ranks` on this node; returns (rank,
    world size, a group of every rank). CUDA: NCCL on device local_rank, which becomes the default
    device (as DeepGEMM); otherwise Gloo on CPU tensors."""
    check_int("init_dist", "num_local_ranks", num_local_ranks, 1)
    check_int("init_dist", "local_rank", local_rank, 0, num_local_ranks - 1,
              fix="pass the process's index on its node, 0..num_local_ranks-1")
    global _local_rank
    _local_rank = local_rank
    num_nodes = int(os.getenv("WORLD_SIZE", "1"))
    node_rank = int(os.getenv("RANK", "0"))
    address = f"tcp://{os.getenv('MASTER_ADDR', '127.0.0.1')}:{int(os.getenv('MASTER_PORT', '8361'))}"
    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo", init_method=address,
                            world_size=num_nodes * num_local_ranks, rank=node_rank * num_local_ranks + local_rank)
    if cuda:
        torch.cuda.set_device(local_rank)
        torch.set_default_device("cuda")
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(num_nodes * num_local_ranks)))


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


def dist_print(s: str = "", once_in_node: bool = False) -> None:
    """Print (every local rank, or only local rank 0 with once_in_node), then wait for every rank."""
    if _local_rank is None:
        raise RuntimeError("dist_print: call init_dist first (it records this process's local rank)")
    if not once_in_node or _local_rank == 0:
        print(s, flush=True)
    dist.barrier()
