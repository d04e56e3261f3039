"""`tile_kernels.testing.generator`: TileKernels' test grids and random inputs.

The grids are TileKernels' (TK_FULL_TEST=1 adds its edge cases: zero tokens, one SM, more experts).
Random tensors come from torch's and Python's global generators (seed them, as TileKernels' random
plugin does) on the CUDA device when there is one, else the CPU; the keyword-only `device=` picks
another. `generate_num_sms` follows `config.get_device_num_sms`, so on a CPU it is the emulated
GPU's count (132 - 20 and 132 for SM90).
"""

from __future__ import annotations

import os
import random
from typing import Iterable, Iterator, Optional, Union

import torch

from ..config import get_device_num_sms
from ..utils import align

__all__ = ["generate_e5m6_inputs", "generate_hidden_sizes", "generate_moe_params", "generate_num_sms",
           "generate_num_tokens", "generate_rand_float", "generate_topk_idx"]

#: token counts of every test (odd, so no kernel may assume a multiple of its block)
NUM_TOKENS = (4001, 8001)
#: hidden sizes of DeepSeek's models (576: MLA's latent + rope width)
HIDDEN_SIZES = (576, 2048, 2560, 3072, 4096, 6144, 7168)
#: how many SMs below the device's count generate_num_sms also tries (a budget left to communication)
SMS_HELD_BACK = 20
#: the largest finite FP32 / 8: generate_rand_float's clamp, so sums of a few values stay finite
RAND_FLOAT_LIMIT = torch.finfo(torch.float32).max / 8
#: E5M6 values a cast must round-trip: the smallest subnormal, the largest subnormal, the smallest normal
E5M6_SPECIAL_VALUES = (2.0 ** -20, 2.0 ** -14 * 63 / 64, 2.0 ** -14)
#: E5M6's largest normal, 2^15 · (1 + 63/64), written in the last column of the special inputs
E5M6_MAX = 65024.0

DeviceLike = Union[str, torch.device, None]


def _full_test() -> bool:
    return os.getenv("TK_FULL_TEST") in ("1", "true", "True")


def _device(device: DeviceLike) -> torch.device:
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def generate_num_tokens(alignment: int = 1, is_benchmark: bool = False) -> list[int]:
    """NUM_TOKENS aligned up to `alignment` (with 0 first under TK_FULL_TEST, except for benchmarks)."""
    counts = ((0,) if _full_test() and not is_benchmark else ()) + NUM_TOKENS
    return [align(n, alignment) for n in counts]


def generate_hidden_sizes(align: int = 64) -> list[int]:
    """The HIDDEN_SIZES that are multiples of `align`."""
    return [h for h in HIDDEN_SIZES if h % align == 0]


def generate_num_sms() -> list[int]:
    """[device count - 20, device count] (1 first under TK_FULL_TEST); the device's count is always last."""
    count = get_device_num_sms()
    return ([1] if _full_test() else []) + [count - SMS_HELD_BACK, count]


def generate_moe_params(is_benchmark: bool = False) -> Iterator[dict]:
    """TileKernels' MoE grid: dicts of num_send_tokens, num_topk, num_experts (per rank) and
    num_ep_ranks, for every total expert count that splits evenly over the ranks."""
    full = _full_test()
    if full and not is_benchmark:
        yield {"num_send_tokens": 0, "num_topk": 1, "num_experts": 1, "num_ep_ranks": 1}
    topks = (2, 6, 8, 9) + ((1, 7) if full else ())
    experts = (72, 256) + ((288, 384) if full else ())
    ranks = (8, 64) + ((1, 72, 256) if full else ())
    for num_topk in topks:
        for total in experts:
            for num_ep_ranks in ranks:
                if total % num_ep_ranks == 0:
                    yield {"num_send_tokens": 4001, "num_topk": num_topk, "num_experts": total // num_ep_ranks,
                           "num_ep_ranks": num_ep_ranks}


def generate_topk_idx(params: dict, *, device: DeviceLike = None) -> torch.Tensor:
    """int64 [T', num_topk]: the top-k of random bf16 scores over every rank's experts for
    num_send_tokens · num_ep_ranks tokens, unsorted, with experts of other ranks as -1 and tokens
    that route to none of this rank's experts dropped (as one rank receives them)."""
    num_send_tokens, num_experts = params["num_send_tokens"], params["num_experts"]
    num_topk, num_ep_ranks = params["num_topk"], params["num_ep_ranks"]
    where = _device(device)
    if num_send_tokens == 0:
        return torch.empty((0, num_topk), dtype=torch.int64, device=where)
    scores = torch.rand((num_send_tokens * num_ep_ranks, num_experts * num_ep_ranks), dtype=torch.bfloat16,
                        device=where)
    topk_idx = scores.topk(num_topk, dim=-1, sorted=False).indices
    remote = topk_idx >= num_experts
    topk_idx = topk_idx.masked_fill(remote, -1)
    return topk_idx[~remote.all(dim=1)]


def generate_e5m6_inputs(num_tokens: int, hidden: int, dtype: torch.dtype, *,
                         device: DeviceLike = None) -> Iterable[tuple[torch.Tensor, bool]]:
    """(x, is_special) pairs: one standard-normal [num_tokens, hidden] tensor (False), then one tensor
    per E5M6_SPECIAL_VALUES filled with it and E5M6_MAX in the last column (True)."""
    where = _device(device)
    yield torch.randn((num_tokens, hidden), dtype=dtype, device=where), False
    for value in E5M6_SPECIAL_VALUES:
        x = torch.full((num_tokens, hidden), value, dtype=dtype, device=where)
        x[:, -1] = E5M6_MAX
        yield x, True


def generate_rand_float(shape: tuple[int, ...], *, device: DeviceLike = None,
                        exponent: Optional[int] = None) -> torch.Tensor:
    """fp32 standard-normal values times 2^e, e uniform in [-110, 126] from Python's `random` (or
    `exponent`), so scale factors of every magnitude get tested; values that overflowed are drawn
    again unscaled, and all are clamped to ±RAND_FLOAT_LIMIT."""
    where = _device(device)
    e = random.randint(-110, 126) if exponent is None else exponent
    x = torch.randn(shape, dtype=torch.float32, device=where) * float(2 ** e)
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        x[bad] = torch.randn((int(bad.sum()),), dtype=torch.float32, device=where)
    return x.clamp(-RAND_FLOAT_LIMIT, RAND_FLOAT_LIMIT)
