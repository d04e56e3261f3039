"""`deep_ep.utils` as DeepEP's tests import it: math (its calc_diff, casts, inplace_unique, grouped
scores, hashes), envs (init_dist on Gloo) and testing (bench, bench_kineto)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from portable_kernels import deep_ep
from portable_kernels.deep_ep.utils import math as dm
from portable_kernels.deep_ep.utils import testing as dt
from portable_kernels.testing.ep_distributed import free_port


def test_calc_diff_compares_x_plus_one_as_deep_ep():
    x = torch.zeros(4)
    assert dm.calc_diff(x, x) == 0.0
    y = torch.full((4,), -1.0)  # x + 1 = 1, y + 1 = 0: similarity 0
    assert dm.calc_diff(x, y) == pytest.approx(1.0)
    assert deep_ep.utils.math is dm


def test_per_token_cast_round_trips_with_deep_eps_bytes():
    torch.manual_seed(3)
    x = torch.randn(5, 300, dtype=torch.bfloat16) * torch.linspace(0.1, 9, 300).bfloat16()
    data, sf = dm.per_token_cast_to_fp8(x)
    assert data.shape == (5, 300) and sf.shape == (5, 3) and sf.dtype == torch.float32
    block = torch.nn.functional.pad(x.float(), (0, 84)).view(5, 3, 128)
    amax = block.abs().amax(2).clamp(min=1e-4)
    torch.testing.assert_close(sf, amax / 448)
    want = (block * (448 / amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(5, -1)[:, :300]
    assert torch.equal(data.view(torch.uint8), want.view(torch.uint8))
    back = dm.per_token_cast_back(data, sf)
    assert back.dtype == torch.bfloat16 and dm.calc_diff(back, x) < 1e-3  # FP8 quantization error
    ue8m0 = torch.exp2(torch.ceil(torch.log2(sf)))                    # power-of-two scales, packed
    words = (ue8m0.view(torch.int32) >> 23).to(torch.uint8)
    packed = torch.nn.functional.pad(words, (0, 1)).view(torch.int32)  # 4 exponents a word
    assert torch.equal(dm.per_token_cast_back(data, packed), dm.per_token_cast_back(data, ue8m0))


def test_inplace_unique_keeps_each_rows_distinct_ids_descending():
    x = torch.tensor([[3, 1, 3, -1], [0, 0, 0, 0], [2, 5, 4, 1]])
    dm.inplace_unique(x, 6)
    assert x.tolist() == [[3, 1, -1, -1], [0, -1, -1, -1], [5, 4, 2, 1]]


def test_grouped_scores_and_hashes():
    scores = torch.arange(1, 13, dtype=torch.float32).view(2, 6)
    masked = dm.create_grouped_scores(scores, torch.tensor([[0], [2]]), 3)
    assert masked.tolist() == [[1, 2, 0, 0, 0, 0], [0, 0, 0, 0, 11, 12]]
    t = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert dm.hash_tensor(t) == 6 and dm.hash_tensors(t, (t, None)) == 0
    assert dm.count_bytes(t, (t, None)) == 24 and dm.ceil_div(7, 2) == 4 and dm.align(7, 4) == 8
    assert dm.safe_div(0, 0) == 0
    with pytest.raises(ZeroDivisionError):
        dm.safe_div(1, 0)


def test_bench_returns_mean_min_max_and_bench_kineto_one_figure_per_name():
    calls = []
    mean, low, high = dt.bench(lambda: calls.append(1), num_warmups=2, num_tests=4)
    assert low <= mean <= high and len(calls) == 6
    assert isinstance(dt.bench_kineto(lambda: None, "dispatch"), float)
    assert len(dt.bench_kineto(lambda: None, ("dispatch", "combine"), num_tests=3)) == 2
    with pytest.raises(TypeError, match="kernel_names"):
        dt.bench_kineto(lambda: None, ["dispatch"])


def test_bench_kineto_gives_k_durations_per_name_with_k_kernels_per_period():
    # test_low_latency's hook mode: `dispatch_t[0] + dispatch_t[1]` (send and receive halves)
    dispatch, combine = dt.bench_kineto(lambda: sum(range(1000)), ("dispatch", "combine"), num_tests=3,
                                        num_kernels_per_period=2)
    assert len(dispatch) == len(combine) == 2 and dispatch[0] == dispatch[1] > 0
    assert len(dt.bench_kineto(lambda: None, "dispatch", num_tests=2, num_kernels_per_period=3)) == 3
    with pytest.raises(ValueError, match="num_kernels_per_period"):
        dt.bench_kineto(lambda: None, "dispatch", num_kernels_per_period=0)


def test_init_dist_joins_a_gloo_group_and_seeds_per_rank():
    code = ("from portable_kernels.deep_ep.utils.envs import init_dist, get_local_seed; import torch; "
            "r, w, g = init_dist(0, 1, seed=5); print(r, w, get_local_seed(), torch.get_default_dtype())")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="1", RANK="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "5", "torch.bfloat16"]
