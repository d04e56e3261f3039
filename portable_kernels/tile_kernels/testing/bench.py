"""`tile_kernels.testing.bench`: how TileKernels' tests name their parameter sets and report speed.

`make_param_id` builds pytest ids (`num_tokens=4001-dtype=bf16`), `make_param_key` the key a
benchmark record is stored under (short names, fixed widths), `dtype_to_str` TileKernels' dtype
names. `suppress_stdout_stderr` silences the process's file descriptors 1 and 2 (native output too);
`empty_suppress` is the no-op stand-in. `print_average_perf` prints the geometric means.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from ...core.errors import ContractError, format_problem
from ...core.harness import empty_suppress, suppress_stdout_stderr

__all__ = ["dtype_to_str", "empty_suppress", "make_param_id", "make_param_key", "print_average_perf",
           "suppress_stdout_stderr"]

#: TileKernels' names of the dtypes its kernels take (int8 holds packed FP4 E2M1 pairs)
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float8_e4m3fn: "e4m3", torch.int8: "e2m1"}
#: the shorter parameter names of a benchmark key
KEY_SHORT_NAMES = {"num_ep_ranks": "ep", "num_experts": "experts", "use_tma_aligned_col_major_sf": "col",
                   "use_packed_ue8m0": "ue8m0", "round_sf": "round"}
#: a benchmark key right-aligns these parameters' values to a fixed width, so keys sort by value
KEY_WIDTHS = {"num_tokens": 5, "num_ep_ranks": 2, "num_experts": 3, "hidden": 4, "use_tma_aligned_col_major_sf": 1,
              "use_packed_ue8m0": 1, "round_sf": 1, "num_per_channels": 4}


def print_average_perf(latency_list: list[float], bandwidth_list: list[float],
                       relative_speed_list: list[float]) -> None:
    """Print the geometric means of latencies (us), bandwidths (GB/s) and speedups (1 when none)."""
    if not latency_list or not bandwidth_list:
        print("Empty latency_list and bandwidth_list")
        return
    speedup = statistics.geometric_mean(relative_speed_list) if relative_speed_list else 1
    print(f"Average Performance: {statistics.geometric_mean(latency_list):.1f} us, "
          f"{statistics.geometric_mean(bandwidth_list):.0f} GB/s, {speedup:.2f}x speedup")


def dtype_to_str(dtype: torch.dtype) -> str:
    """"fp32", "bf16", "e4m3" or "e2m1" (int8: packed FP4); a ContractError (a ValueError) for others."""
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        raise ContractError(format_problem("dtype_to_str", "dtype", dtype, "torch.float32, torch.bfloat16, "
                                           "torch.float8_e4m3fn or torch.int8 (e2m1)",
                                           "name other dtypes yourself; only TileKernels' kernel dtypes have names"))
    return name


def _param_value(value: Any) -> str:
    if isinstance(value, torch.dtype):
        return dtype_to_str(value)
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value)
    return str(value)


def make_param_key(params: dict) -> str:
    """`short=value,...` over the parameters that are not None, widths as KEY_WIDTHS (a benchmark record's key)."""
    parts = []
    for key, value in params.items():
        if value is None:
            continue
        text = format(value, f">{KEY_WIDTHS[key]}") if key in KEY_WIDTHS else value
        parts.append(f"{KEY_SHORT_NAMES.get(key, key)}={text}")
    return ",".join(parts)


def make_param_id(params: dict) -> str:
    """`key=value-key=value` (dtypes by TileKernels' names, tuples as `AxB`), or "default" for no parameters."""
    return "-".join(f"{key}={_param_value(value)}" for key, value in params.items()) or "default"
