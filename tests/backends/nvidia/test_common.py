"""The shared Triton helpers (rounding casts, scale loads) against torch, in the interpreter."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from portable_kernels.backends.nvidia.kernels import _common  # noqa: E402
from portable_kernels.backends.nvidia.kernels._common import (INTERPRET, ceil_ue8m0, e4m3_codes,  # noqa: E402
                                                              load_scales, to_bf16)
from portable_kernels.layouts import ceil_to_ue8m0, sm100_ue8m0_encode, sm90_sfa_encode  # noqa: E402


@triton.jit
def _casts(x_ptr, fp8_ptr, bf16_ptr, ue8_ptr, n, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    clamped = tl.clamp(x, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
    tl.store(fp8_ptr + offs, e4m3_codes(clamped, INTERPRET), mask=mask)
    tl.store(bf16_ptr + offs, to_bf16(x, INTERPRET), mask=mask)
    tl.store(ue8_ptr + offs, ceil_ue8m0(tl.abs(x)), mask=mask)


def _edge_values() -> torch.Tensor:
    """Exact e4m3 ties and neighbours, subnormals, both zeros, the clamp edges, and random values."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)].unique()
    mids = (grid[1:] + grid[:-1]) / 2  # every e4m3 tie (ties to even decide)
    near = torch.cat([mids.nextafter(mids + 1), mids.nextafter(mids - 1)])
    rand = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * torch.logspace(-12, 3, 4096)
    special = torch.tensor([0.0, -0.0, 448.0, -448.0, 500.0, 1e-30, 2.0 ** -10, float("nan"), -float("nan")])
    return torch.cat([grid, mids, near, rand, special])


def test_interpreter_mode_is_on_for_these_tests():
    assert INTERPRET and _common.runtime.current_mode() == "interpreter"


def test_casts_round_like_torch():
    x = _edge_values()
    fp8 = torch.empty(x.numel(), dtype=torch.uint8)
    bf16 = torch.empty(x.numel(), dtype=torch.bfloat16)
    ue8 = torch.empty(x.numel())
    _casts[(triton.cdiv(x.numel(), 512),)](x, fp8, bf16, ue8, x.numel(), BLOCK=512, INTERPRET=INTERPRET)
    want_fp8 = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(fp8, want_fp8), int((fp8 != want_fp8).sum())
    finite = ~torch.isnan(x)  # bf16 NaN payloads may differ; NaN stays NaN
    assert torch.equal(bf16.view(torch.int16)[finite], x.to(torch.bfloat16).view(torch.int16)[finite])
    assert torch.isnan(bf16[~finite]).all()
    positive = (x.abs() > 0) & finite
    assert torch.equal(ue8[positive], ceil_to_ue8m0(x.abs()[positive]))


@triton.jit
def _read_scales(s_ptr, out_ptr, rows, kbs, stride_mn, stride_k, RB: tl.constexpr, PACKED: tl.constexpr):
    r = tl.arange(0, RB)
    for kb in range(0, kbs):
        v = load_scales(s_ptr, r, kb, stride_mn, stride_k, r < rows, PACKED)
        tl.store(out_ptr + r * kbs + kb, v, mask=r < rows)


@pytest.mark.parametrize("packed", [False, True])
def test_scale_loads_read_sm90_and_sm100_bytes(packed):
    rows, kbs = 5, 7
    sf = ceil_to_ue8m0(torch.rand(rows, kbs, generator=torch.Generator().manual_seed(1)) + 1e-3)
    storage = sm100_ue8m0_encode(sf) if packed else sm90_sfa_encode(sf)
    out = torch.full((rows, kbs), float("nan"))
    _read_scales[(1,)](storage, out, rows, kbs, storage.stride(0), storage.stride(1), RB=8, PACKED=packed)
    assert torch.equal(out, sf)


def test_interpreted_launches_from_several_threads_do_not_collide():
    """Triton's interpreter patches triton.language per launch: the launchers serialize themselves."""
    import threading
    from portable_kernels.backends.nvidia.kernels import cast_fp8, topk
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(3))
    errors, barrier = [], threading.Barrier(6)

    def work(i):
        barrier.wait()
        try:
            if i % 2:
                topk.topk(x, 4)
            else:
                cast_fp8.cast_to_fp8(x, (1, 128), True, "sm100")
        except Exception as exc:  # collected, asserted below
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
