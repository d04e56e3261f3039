"""TileKernels' cast bytes written from its documented math (an oracle for the tests, independent of
`portable_kernels`' own code paths): per block amax clamped to a floor, sf = amax / max, data =
x · (max / amax) in fp32; with round_sf the scale's fp32 bits are rounded up with
`(bits + 0x7FFFFF) & 0x7F800000` and data = x · (1 / sf). FP8 clamps to ±448 and rounds to nearest
even; FP4 picks the nearest E2M1 magnitude (ties to the even code), keeps the sign bit (so tiny
negatives give -0) and saturates at 6; codes pack two per byte, even element in the low nibble.
"""

from __future__ import annotations

import torch

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
FLOORS = {"e4m3": 1e-4, "e2m1": 6.0 * 2.0 ** -126}
MAXIMA = {"e4m3": 448.0, "e2m1": 6.0}


def round_up_pow2(sf: torch.Tensor) -> torch.Tensor:
    bits = sf.contiguous().view(torch.int32)
    return ((bits + 0x007FFFFF) & 0x7F800000).view(torch.float32)


def e2m1_codes(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes of fp32 values by exhaustive nearest search in fp64 (exact for fp32 inputs)."""
    mag = q.double().abs().clamp(max=6.0)
    dist = (mag[..., None] - E2M1_GRID).abs()
    best = dist.min(dim=-1, keepdim=True).values
    candidates = dist == best
    # among equally near grid points the even index wins (ties to even)
    even = torch.arange(8) % 2 == 0
    index = torch.where(candidates & even, torch.arange(8), 99).amin(-1)
    index = torch.where(index == 99, torch.where(candidates, torch.arange(8), 99).amin(-1), index)
    return (index + 8 * torch.signbit(q).long()).to(torch.uint8)


def tile_cast(x: torch.Tensor, fmt: str, block: tuple[int, int], round_sf: bool = False,
              clamp_min: float | None = None, sf: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, fp32 sf [ceil(M/bm), ceil(K/bk)]): fp8 data, or int8 [M, K/2] packed E2M1 for 'e2m1'.
    With `sf` given (TileKernels' precomputed scales) data = x · (1 / sf)."""
    m, k = x.shape
    bm, bk = block
    rows, cols = -(-m // bm), -(-k // bk)
    xf = x.float()
    padded = torch.zeros(rows * bm, cols * bk)
    padded[:m, :k] = xf
    amax = padded.view(rows, bm, cols, bk).abs().amax(dim=(1, 3))
    amax = torch.maximum(amax, torch.tensor(FLOORS[fmt] if clamp_min is None else clamp_min, dtype=torch.float32))
    top = torch.full_like(amax, MAXIMA[fmt])
    if sf is not None:
        inv = torch.ones_like(sf) / sf
    else:
        sf = amax / top
        inv = torch.ones_like(sf) / round_up_pow2(sf) if round_sf else top / amax
        if round_sf:
            sf = round_up_pow2(sf)
    inv_full = inv.repeat_interleave(bm, 0).repeat_interleave(bk, 1)[:m, :k]
    q = xf * inv_full
    if fmt == "e4m3":
        return q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn), sf
    codes = e2m1_codes(q)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.view(torch.int8), sf


def grid_midpoints(fmt: str) -> torch.Tensor:
    """Midpoints between neighbouring positive values of the format (where rounding ties sit)."""
    if fmt == "e4m3":
        values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        grid = values[torch.isfinite(values) & (values >= 0)].unique().sort().values
    else:
        grid = E2M1_GRID.float()
    return (grid[:-1] + grid[1:]) / 2


def near_midpoints(rows: int, cols: int, fmt: str, seed: int) -> torch.Tensor:
    """fp32 [rows, cols] whose scaled values sit on or within 2 ulp of rounding ties: per row a random
    amax (column 0), the other entries mid · amax / max nudged by -2..2 ulp, random signs. Here the
    two scale rules (x · (max/amax) and x / (amax/max)) round a few percent of codes differently."""
    g = torch.Generator().manual_seed(seed)
    amax = torch.rand(rows, 1, generator=g) * 1000 + 1e-3
    mids = grid_midpoints(fmt)
    x = mids[torch.randint(0, mids.numel(), (rows, cols), generator=g)] * (amax / MAXIMA[fmt])
    nudged = x.view(torch.int32) + torch.randint(-2, 3, (rows, cols), generator=g, dtype=torch.int32)
    x = nudged.view(torch.float32) * torch.where(torch.rand(rows, cols, generator=g) < 0.5, -1.0, 1.0)
    x[:, 0] = amax[:, 0]
    return x


def packed_words(sf: torch.Tensor) -> torch.Tensor:
    """int32 [rows, ceil(kb/4)]: word (m, p) = e[m][4p] | e[m][4p+1] << 8 | ... with e = the fp32
    exponent byte of each (power-of-two) scale; missing trailing exponents are 0."""
    e = (sf.contiguous().view(torch.int32) >> 23) & 0xFF
    rows, kb = e.shape
    words = -(-kb // 4)
    padded = torch.zeros(rows, words * 4, dtype=torch.int64)
    padded[:, :kb] = e
    shifts = torch.tensor([0, 8, 16, 24])
    return (padded.view(rows, words, 4) << shifts).sum(-1).to(torch.uint32).view(torch.int32)


def tile_swiglu(x: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """TileKernels' fp32 SwiGLU formula: gate / (1 + exp(-gate)) · up (· row weight)."""
    gate, up = x.float().chunk(2, dim=-1)
    out = gate / (1.0 + torch.exp(-gate)) * up
    return out if weights is None else out * weights[:, None]


def tile_reduce(x: torch.Tensor, topk_weights: torch.Tensor | None, token_topk_to_pos: torch.Tensor,
                x_sf: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 [T, H] as TileKernels' reduce_fused sums: slot by slot from 0, s = weight (or 1) times
    x_sf[pos] in fp32, then acc = fma(x[pos], s, acc). The fma is the Triton interpreter's (std::fma
    on the host), independent of portable_kernels' own."""
    from triton.runtime.interpreter import _interpreter
    t, k = token_topk_to_pos.shape
    acc = torch.zeros(t, x.shape[1], dtype=torch.float32).numpy()
    xs = x.float().numpy()
    for token in range(t):
        for slot in range(k):
            pos = int(token_topk_to_pos[token, slot])
            if pos < 0:
                continue
            s = torch.tensor(1.0 if topk_weights is None else float(topk_weights[token, slot]))
            if x_sf is not None:
                s = s * x_sf[pos]
            scale = torch.full((x.shape[1],), float(s), dtype=torch.float32).numpy()
            acc[token] = _interpreter.fma_fp32(xs[pos], scale, acc[token])
    return torch.from_numpy(acc)
