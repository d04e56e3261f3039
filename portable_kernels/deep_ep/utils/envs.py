"""`deep_ep.utils.envs`: DeepEP's process-group and seed helpers, on NCCL where CUDA is present and
Gloo otherwise (the same environment variables: MASTER_ADDR, MASTER_PORT, WORLD_SIZE = nodes,
RANK = node rank). The NVLink / RDMA probes of upstream's envs are not provided (docs/porting.md)."""

from __future__ import annotations

import random

import torch
import torch.distributed as dist

from ...core.harness import dist_print, join_process_group

__all__ = ["dist_print", "get_global_seed", "get_local_seed", "init_dist", "init_seed"]

_state = {"local_seed": 0, "global_seed": 0}


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


def init_dist(local_rank: int, num_local_ranks: int, seed: int = 0) -> tuple[int, int, dist.ProcessGroup]:
    """Join the job as local rank `local_rank` of `num_local_ranks`; returns (rank, world size, a group
    of every rank). CUDA: NCCL on device local_rank with bf16 / cuda defaults, as DeepEP; otherwise
    Gloo on CPU tensors with bf16 as the default dtype (DeepEP's tests build their tensors so)."""
    if not 0 <= local_rank < num_local_ranks:
        raise ValueError(f"init_dist: local_rank {local_rank} not in [0, {num_local_ranks})")
    world = join_process_group(local_rank, num_local_ranks)
    torch.set_default_dtype(torch.bfloat16)
    init_seed(seed)
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(world)))
