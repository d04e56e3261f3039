"""`deep_ep.utils.envs`: DeepEP's process-group and seed helpers, on NCCL where CUDA is present and
Gloo otherwise (the same environment variables: MASTER_ADDR, MASTER_PORT, WORLD_SIZE = nodes,
RANK = node rank). The NVLink / RDMA probes of upstream's envs are not provided (docs/porting.md)."""

from __future__ import annotations

import os
import random

import torch
import torch.distributed as dist

__all__ = ["dist_print", "get_global_seed", "get_local_seed", "init_dist", "init_seed"]

_state = {"local_rank": None, "local_seed": 0, "global_seed": 0}


def init_seed(global_seed: int) -> None:
    """Seed torch and random with global_seed + this rank (DeepEP's per-rank seed)."""
    _state["global_seed"] = global_seed
    _state["local_seed"] = global_seed + dist.get_rank()
    torch.manual_seed(_state["local_seed"])
    random.seed(_state["local_seed"])


def get_local_seed() -> int:
    return int(_state["local_seed"])


def get_global_seed() -> int:
    return int(_state["global_seed"])


def dist_print(s: str = "", once_in_node: bool = False) -> None:
    """Print (every rank, or local rank 0 only), then wait for every rank."""
    if _state["local_rank"] is None:
        raise RuntimeError("dist_print: call init_dist first (it records this process's local rank)")
    if not once_in_node or _state["local_rank"] == 0:
        print(s, flush=True)
    dist.barrier()


def init_dist(local_rank: int, num_local_ranks: int, seed: int = 0) -> tuple[int, int, dist.ProcessGroup]:
    """Join the job as local rank `local_rank` of `num_local_ranks`; returns (rank, world size, a group
    of every rank). CUDA: NCCL on device local_rank with bf16 / cuda defaults, as DeepEP; otherwise
    Gloo on CPU tensors with bf16 as the default dtype (DeepEP's tests build their tensors so)."""
    if not 0 <= local_rank < num_local_ranks:
        raise ValueError(f"init_dist: local_rank {local_rank} not in [0, {num_local_ranks})")
    _state["local_rank"] = local_rank
    num_nodes = int(os.getenv("WORLD_SIZE", "1"))
    node_rank = int(os.getenv("RANK", "0"))
    address = f"tcp://{os.getenv('MASTER_ADDR', '127.0.0.1')}:{int(os.getenv('MASTER_PORT', '8361'))}"
    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo", init_method=address,
                            world_size=num_nodes * num_local_ranks, rank=node_rank * num_local_ranks + local_rank)
    torch.set_default_dtype(torch.bfloat16)
    if cuda:
        torch.set_default_device("cuda")
        torch.cuda.set_device(local_rank)
    init_seed(seed)
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(num_nodes * num_local_ranks)))
