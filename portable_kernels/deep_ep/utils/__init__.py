"""`deep_ep.utils`: the helpers DeepEP's tests import, under upstream's module paths — `math` (casts,
calc_diff, inplace_unique, grouped scores, hashes), `envs` (init_dist, seeds, dist_print) and
`testing` (bench, bench_kineto). Written for any torch.distributed backend and device; the ones
about NVLink / RDMA / NCCL hardware are not provided (docs/porting.md)."""

from . import envs, math, testing

__all__ = ["envs", "math", "testing"]
