"""Pictures of the byte layouts: which scale lands in which byte on SM90, SM100 and Ascend.

Rule: every picture is drawn from the bytes the real encoders in `portable_kernels.layouts` write
(each scale is tagged with a distinct value and looked up again), never from a hand-made copy, so
the pictures cannot drift from the code. matplotlib is an optional extra
(`pip install portable-kernels[plot]`) and is imported only when a picture is drawn.
"""

from __future__ import annotations

import pathlib
from typing import Any

import torch

from portable_kernels.layouts import (ascend_mx_encode, e2m1_encode, nd_to_nz, pack_e2m1, regranularize_k,
                                      sm90_sfa_encode, sm100_ue8m0_encode)

__all__ = ["plot_scale_layouts", "plot_fp4_packing", "plot_nz_tiles"]

# The FORMATS.md worked example: activations with M = 3, K = 512 -> 4 scales of 128 per row.
EXAMPLE_M = 3
EXAMPLE_K = 512
EXAMPLE_KB = 4

_ROW_HUES = ("Blues", "Oranges", "Greens")
_PAD_COLOR = "#d9d9d9"


def _matplotlib() -> Any:
    try:
        import matplotlib  # noqa: F401  (Figure.savefig needs no pyplot backend)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "drawing layout pictures needs matplotlib: pip install portable-kernels[plot]"
        ) from exc
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    return Figure, Rectangle


def _scale_color(m: int, kb: int) -> Any:
    import matplotlib

    return matplotlib.colormaps[_ROW_HUES[m % len(_ROW_HUES)]](0.35 + 0.15 * kb)


def _tagged_scales() -> torch.Tensor:
    """Distinct power-of-two scales s[m][kb] = 2^(m*EXAMPLE_KB + kb), so every byte names its source."""
    exponents = torch.arange(EXAMPLE_M * EXAMPLE_KB, dtype=torch.float32).view(EXAMPLE_M, EXAMPLE_KB)
    return torch.pow(2.0, exponents)


def _source_of_exponent(byte: int) -> tuple[int, int] | None:
    tag = byte - 127  # exponent byte of 2^tag
    if 0 <= tag < EXAMPLE_M * EXAMPLE_KB:
        return divmod(tag, EXAMPLE_KB)
    return None


def _storage_bytes(t: torch.Tensor) -> list[int]:
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).tolist()


def _draw_strip(ax: Any, Rectangle: Any, y: float, cells: list[tuple[int, int, str, Any]], title: str) -> None:
    """cells: (first byte, byte width, label, color); one strip of memory, byte addresses on top."""
    for start, width, label, color in cells:
        ax.add_patch(Rectangle((start, y), width, 1, facecolor=color, edgecolor="black", linewidth=0.8))
        rotation = 0 if width >= 3 else 90
        ax.text(start + width / 2, y + 0.5, label, ha="center", va="center", fontsize=8, rotation=rotation)
    end = max(start + width for start, width, _, _ in cells)
    for address in range(0, end + 1, 4):
        ax.text(address, y + 1.08, str(address), ha="center", va="bottom", fontsize=6, color="#555555")
    ax.text(-1.0, y + 0.5, title, ha="right", va="center", fontsize=9, fontweight="bold")


def _sm90_cells() -> list[tuple[int, int, str, Any]]:
    out = sm90_sfa_encode(_tagged_scales())
    floats = torch.empty(0, dtype=torch.float32).set_(out.untyped_storage()).tolist()
    cells = []
    for index, value in enumerate(floats):
        source = _source_of_exponent(int(torch.tensor(value).view(torch.int32)) >> 23) if value else None
        if source is None:
            cells.append((4 * index, 4, "pad", _PAD_COLOR))
        else:
            m, kb = source
            cells.append((4 * index, 4, f"s{m}{kb}", _scale_color(m, kb)))
    return cells


def _byte_cells(raw: list[int], label: str) -> list[tuple[int, int, str, Any]]:
    cells = []
    for address, byte in enumerate(raw):
        source = _source_of_exponent(byte)
        if source is None:
            cells.append((address, 1, "0" if byte == 0 else f"{byte:02x}", _PAD_COLOR))
        else:
            m, kb = source
            cells.append((address, 1, label.format(m=m, kb=kb), _scale_color(m, kb)))
    return cells


def plot_scale_layouts(out_dir: str | pathlib.Path) -> list[pathlib.Path]:
    """Draw the M = 3, K = 512 scale example on SM90, SM100 and Ascend, plus FP4 packing and NZ tiles.

    Writes PNG files into `out_dir` (created if needed) and returns their paths:
    `scale_layouts_m3_k512.png`, `fp4_nibble_packing.png`, `nz_tiles.png`.
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [_plot_scales(out / "scale_layouts_m3_k512.png"), plot_fp4_packing(out), plot_nz_tiles(out)]


def _plot_scales(path: pathlib.Path) -> pathlib.Path:
    Figure, Rectangle = _matplotlib()
    fig = Figure(figsize=(17, 6.2), dpi=110)
    ax = fig.add_axes((0.01, 0.02, 0.98, 0.86))

    # Logical scales s[m][kb] (one per row and 128 K-elements), drawn as a small matrix.
    for m in range(EXAMPLE_M):
        for kb in range(EXAMPLE_KB):
            ax.add_patch(Rectangle((kb * 4, 12 - m), 4, 1, facecolor=_scale_color(m, kb), edgecolor="black"))
            ax.text(kb * 4 + 2, 12.5 - m, f"s{m}{kb}", ha="center", va="center", fontsize=9)
    ax.text(-1.0, 11.5, "logical fp32\n[M=3, K/128=4]", ha="right", va="center", fontsize=9, fontweight="bold")
    ax.text(17, 11.5, "row m = colour, K-block kb = shade;  e = exponent byte (UE8M0) of s", fontsize=9, va="center")

    _draw_strip(ax, Rectangle, 7.2, _sm90_cells(), "SM90 fp32\n64 bytes")
    ax.text(0, 6.6, "strides (1, tma_mn=4): float kb*4 + m; one pad float per K-block column", fontsize=8)

    sm100 = _storage_bytes(sm100_ue8m0_encode(_tagged_scales()))
    _draw_strip(ax, Rectangle, 4.2, _byte_cells(sm100, "e{m}{kb}"), "SM100 int32\n16 bytes")
    ax.text(0, 3.6, "int32 word per row m: e[m][0] | e[m][1]<<8 | e[m][2]<<16 | e[m][3]<<24; 4th word = pad row",
            fontsize=8)  # fmt: skip

    ascend = _storage_bytes(ascend_mx_encode(regranularize_k(_tagged_scales(), EXAMPLE_K, 128, 32)))
    _draw_strip(ax, Rectangle, 1.2, _byte_cells(ascend, "e{m}{kb}"), "Ascend int16\n48 bytes")
    ax.text(0, 0.6, "blocks of 32 (e32[m][j] = e[m][j//4]); int16 word (p, m) at p*3 + m holds blocks 2p, 2p+1; "
            "no padding", fontsize=8)  # fmt: skip

    ax.set_xlim(-7, 65)
    ax.set_ylim(0.3, 13.3)
    ax.axis("off")
    fig.suptitle("Where each scale of the M = 3, K = 512 example lands (byte addresses on top)", fontsize=12)
    fig.savefig(path)
    return path


def plot_fp4_packing(out_dir: str | pathlib.Path) -> pathlib.Path:
    """Draw E2M1 codes of one row and the bytes they pack into (even element in the low nibble)."""
    Figure, Rectangle = _matplotlib()
    path = pathlib.Path(out_dir) / "fp4_nibble_packing.png"
    values = torch.tensor([1.0, -0.5, 6.0, 0.0, -3.0, 1.5, 0.5, -6.0])
    codes = e2m1_encode(values)
    packed = pack_e2m1(codes).tolist()
    fig = Figure(figsize=(11, 3.4), dpi=110)
    ax = fig.add_axes((0.02, 0.02, 0.96, 0.82))
    for i, (value, code) in enumerate(zip(values.tolist(), codes.tolist())):
        color = "#9ecae1" if i % 2 == 0 else "#fdae6b"
        ax.add_patch(Rectangle((i * 2, 3), 2, 1, facecolor=color, edgecolor="black"))
        ax.text(i * 2 + 1, 3.5, f"x{i} = {value:g}\ncode 0x{code:x}", ha="center", va="center", fontsize=8)
    for b, byte in enumerate(packed):
        hi, lo = byte >> 4, byte & 0xF
        ax.add_patch(Rectangle((b * 4, 0.5), 2, 1, facecolor="#fdae6b", edgecolor="black"))
        ax.add_patch(Rectangle((b * 4 + 2, 0.5), 2, 1, facecolor="#9ecae1", edgecolor="black"))
        ax.text(b * 4 + 1, 1.0, f"hi: x{2 * b + 1}\n{hi:x}", ha="center", va="center", fontsize=8)
        ax.text(b * 4 + 3, 1.0, f"lo: x{2 * b}\n{lo:x}", ha="center", va="center", fontsize=8)
        ax.text(b * 4 + 2, 0.2, f"byte {b} = 0x{byte:02x}", ha="center", va="center", fontsize=9, fontweight="bold")
        ax.annotate("", xy=(b * 4 + 3, 1.5), xytext=(b * 4 + 1, 3), arrowprops={"arrowstyle": "->", "color": "#3182bd"})
        ax.annotate("", xy=(b * 4 + 1, 1.5), xytext=(b * 4 + 3, 3), arrowprops={"arrowstyle": "->", "color": "#e6550d"})
    ax.set_xlim(-0.2, 16.2)
    ax.set_ylim(0, 4.2)
    ax.axis("off")
    fig.suptitle("FP4 E2M1: byte = c[2i] | c[2i+1] << 4 (even element in the LOW nibble)", fontsize=11)
    fig.savefig(path)
    return path


def plot_nz_tiles(out_dir: str | pathlib.Path, m: int = 20, n: int = 40) -> pathlib.Path:
    """Draw a bf16 ND matrix [m, n] coloured by NZ tile, and the NZ memory order (C0 = 16, 16 rows per tile)."""
    Figure, _ = _matplotlib()
    import matplotlib

    path = pathlib.Path(out_dir) / "nz_tiles.png"
    index = torch.arange(1, m * n + 1, dtype=torch.int16).view(m, n)  # 0 marks padding after the move
    nz = nd_to_nz(index.view(torch.bfloat16)).view(torch.int16)  # [n1, m1, 16, C0]
    n1, m1, rows, c0 = nz.shape
    tile_of = torch.arange(n1 * m1).view(n1, m1)  # tile [j][i] is the (j*m1 + i)-th in memory
    nd_tiles = tile_of[torch.arange(n) // c0][:, torch.arange(m) // rows].t().float()  # [m, n]
    memory = nz.reshape(-1, c0).long()  # one line per 32-byte tile row, in address order
    flat_tile = torch.where(memory > 0, nd_tiles.flatten()[(memory - 1).clamp(min=0)], torch.nan)
    cmap = matplotlib.colormaps["tab10"].with_extremes(bad=_PAD_COLOR)
    fig = Figure(figsize=(12, 7), dpi=110, layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1.4, 1])
    left.imshow(nd_tiles.numpy(), cmap=cmap, vmin=0, vmax=9, aspect="equal", interpolation="nearest")
    left.set_title(f"ND bf16 [{m}, {n}] coloured by NZ tile\n(a tile is 16 rows x C0 = 16 columns = 512 bytes)",
                   fontsize=9)  # fmt: skip
    left.set_xlabel("column j")
    left.set_ylabel("row i")
    for j in range(n1):
        for i in range(m1):
            top, bottom = i * rows, min((i + 1) * rows, m)
            x = (j * c0 + min((j + 1) * c0, n)) / 2 - 0.5
            y = (top + bottom) / 2 - 0.5
            left.text(x, y, f"[{j}][{i}]", ha="center", va="center", fontsize=9, color="white", fontweight="bold")
    right.imshow(flat_tile.numpy(), cmap=cmap, vmin=0, vmax=9, aspect="auto", interpolation="nearest")
    right.set_title(f"NZ memory [{n1}, {m1}, 16, {c0}] in address order\none line = one 32-byte row of a tile; "
                    "grey = zero padding", fontsize=9)  # fmt: skip
    right.set_xlabel("element within the 32-byte line (C0 = 16)")
    right.set_ylabel("line = address / 32 bytes")
    for t in range(n1 * m1):
        j, i = divmod(t, m1)
        right.text(c0 + 0.2, t * rows + rows / 2 - 0.5, f"tile [{j}][{i}]", va="center", fontsize=8)
        if t:
            right.axhline(t * rows - 0.5, color="black", linewidth=0.6)
    fig.suptitle("Ascend FRACTAL_NZ: column tiles outermost, then row tiles, 16 rows, C0 columns", fontsize=11)
    fig.savefig(path)
    return path
