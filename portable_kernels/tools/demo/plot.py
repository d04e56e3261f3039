"""`demo --plot DIR`: the bytes one expert weight is stored in on every backend, side by side.

Each panel is the scale storage of the same 256x512 FP8 weight (2 x 4 blocks of 128x128, each
block's power-of-two scale tagged with its own exponent) as the backend's Format lays it out in
memory — one cell per byte, in address order, coloured by the block the byte belongs to (grey:
padding) — with the Format's name, dtype, shape and strides. Drawn from the bytes the real
encoders write, so the picture cannot drift from the code.
matplotlib is an optional extra (`pip install 'portable-kernels[plot]'`).
"""

from __future__ import annotations

import pathlib

import torch

from ...core.prepare import prepare_inputs
from ...core.tensors import QuantTensor
from ...core.registry import use_backend
from .model import GROUPED
from .run import runnable_targets


#: block (nb, kb) of the tagged weight gets exponent byte TAG_BASE + nb * K_BLOCKS + kb
TAG_BASE, N_BLOCKS, K_BLOCKS = 120, 2, 4


def _tagged_weight() -> QuantTensor:
    codes = torch.randint(1, 0x70, (1, N_BLOCKS * 128, K_BLOCKS * 128), generator=torch.Generator().manual_seed(7),
                          dtype=torch.uint8)
    exponents = TAG_BASE + torch.arange(N_BLOCKS * K_BLOCKS, dtype=torch.int32).view(1, N_BLOCKS, K_BLOCKS)
    return QuantTensor(codes.view(torch.float8_e4m3fn), (exponents << 23).view(torch.float32), (128, 128), ue8m0=True)


def _block_of_each_byte(scale: torch.Tensor) -> torch.Tensor:
    """Per storage byte (address order), the tagged block it carries, or -1 for padding."""
    raw = torch.empty(0, dtype=torch.uint8).set_(scale.untyped_storage()).to(torch.int32)
    if scale.dtype == torch.float32:  # one scale per 4 bytes: the exponent names the block
        words = torch.empty(0, dtype=torch.int32).set_(scale.untyped_storage())
        raw = ((words >> 23) & 0xFF).repeat_interleave(4)
    block = raw - TAG_BASE
    return torch.where((block >= 0) & (block < N_BLOCKS * K_BLOCKS), block, -1)


def _grid(blocks: torch.Tensor, width: int = 64) -> torch.Tensor:
    rows = -(-blocks.numel() // width)
    grid = torch.full((rows * width,), float("nan"))
    grid[:blocks.numel()] = torch.where(blocks >= 0, blocks.float(), float("nan"))
    return grid.view(rows, width)


def plot_weight_formats(out_dir: str | pathlib.Path) -> pathlib.Path:
    """Write `weight_formats.png` into out_dir (created if needed) and return its path."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("drawing needs matplotlib: pip install 'portable-kernels[plot]'") from exc
    weight = _tagged_weight()
    targets = [(name, options) for name, _, options in runnable_targets()]
    fig = Figure(figsize=(12, 2.2 * len(targets)), dpi=100)
    for i, (name, options) in enumerate(targets):
        ax = fig.add_subplot(len(targets), 1, i + 1)
        with use_backend(name, **options):
            prepared = prepare_inputs(GROUPED, b=weight)["b"]
        scale = prepared.scale
        cmap = _colormap()
        ax.imshow(_grid(_block_of_each_byte(scale)).numpy(), aspect="auto", cmap=cmap, interpolation="nearest",
                  vmin=0, vmax=N_BLOCKS * K_BLOCKS - 1)
        label = ",".join(f"{k}={v}" for k, v in sorted(options.items()))
        ax.set_title(f"{name}{f'[{label}]' if label else ''}: {prepared.format.name} — scale {scale.dtype} "
                     f"{tuple(scale.shape)} strides {scale.stride()}, {scale.nbytes} bytes; data "
                     f"{prepared.data.dtype} {tuple(prepared.data.shape)}", fontsize=8, loc="left")
        ax.set_yticks([])
        ax.set_xlabel("byte (address order, 64 per row); colour = block (n_block * 4 + k_block), grey = padding",
                      fontsize=7)
    fig.tight_layout()
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "weight_formats.png"
    fig.savefig(path)
    return path


def _colormap():
    from matplotlib import colormaps
    cmap = colormaps["tab10"].copy()
    cmap.set_bad("#d9d9d9")
    return cmap
