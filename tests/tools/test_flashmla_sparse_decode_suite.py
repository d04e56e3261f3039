"""The FlashMLA sparse-decode driver's one rewrite of upstream's tree (the rest runs unchanged)."""

from __future__ import annotations

import pytest

from portable_kernels.tools.upstream_suites import flashmla_sparse_decode as suite


def test_the_tree_keeps_cache_seqlens_on_the_cpu_and_copies_the_rest(tmp_path):
    checkout = tmp_path / "FlashMLA"
    (checkout / "tests" / "kernelkit").mkdir(parents=True)
    (checkout / "tests" / "lib.py").write_text("cache_seqlens = cache_seqlens_cpu.cuda()\nx = 1\n")
    (checkout / "tests" / "kernelkit" / "__init__.py").write_text("y = 2\n")
    tests = suite._tree(checkout, tmp_path / "work")
    assert (tests / "lib.py").read_text() == "cache_seqlens = cache_seqlens_cpu\nx = 1\n"
    assert (tests / "kernelkit" / "__init__.py").read_text() == "y = 2\n"


def test_an_upstream_change_to_the_rewritten_line_stops_the_run(tmp_path):
    checkout = tmp_path / "FlashMLA"
    (checkout / "tests").mkdir(parents=True)
    (checkout / "tests" / "lib.py").write_text("cache_seqlens = cache_seqlens_cpu.to('cuda')\n")
    with pytest.raises(SystemExit, match="upstream changed"):
        suite._tree(checkout, tmp_path / "work")
