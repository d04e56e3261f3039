"""The layout pictures are drawn from the real encoders; matplotlib stays optional."""

import sys

import pytest

from portable_kernels.tools import plots


def test_plot_scale_layouts_writes_three_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    paths = plots.plot_scale_layouts(tmp_path / "img")
    assert [p.name for p in paths] == ["scale_layouts_m3_k512.png", "fp4_nibble_packing.png", "nz_tiles.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install portable-kernels\[plot\]"):
        plots.plot_scale_layouts(tmp_path)
