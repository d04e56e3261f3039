"""The command line: demo, doctor and conformance."""

from __future__ import annotations

from portable_kernels.__main__ import main
from portable_kernels.demo import run_demo, runnable_targets


def test_demo_prints_a_row_per_runnable_backend(capsys):
    assert main(["demo", "--m", "8", "--n", "256", "--k", "512"]) == 0
    out = capsys.readouterr().out
    assert "fp8_gemm_nt" in out
    for name, _, _ in runnable_targets():
        assert f"\n{name} " in out


def test_demo_results_are_within_contract():
    rows = run_demo(m=4, n=128, k=384)
    assert any(row.backend == "cpu" and not row.note for row in rows)
    for row in rows:
        if row.note:  # a backend without the demo's ops (e.g. a partial plugin) is reported, not run
            assert row.note.startswith("skipped:") and row.backend not in ("cpu", "nvidia", "ascend")
            continue
        assert row.diff_dequantized < 1e-5 and row.diff_unquantized < 2e-3


def test_doctor_lists_cpu_and_its_providers(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "cpu: devices ['cpu']" in out and "format fp32-row-major" in out
    assert "fp8_gemm_nt:\n      native (priority 10) — formats a: fp32-row-major; b: fp32-row-major" in out
    assert "      reference (priority 0) — formats a: fp32-row-major; b: fp32-row-major" in out
    assert "native host code (deepjit" in out and "cpu_gemm (cpu, gemm.cpp):" in out
    assert "layout-reference (priority -100)" in out and "nvidia:" in out


def test_warmup_builds_every_native_library(capsys):
    assert main(["warmup", "--backend", "cpu"]) == 0
    assert "native libraries" in capsys.readouterr().out


def test_conformance_cli_exit_code_reflects_the_report(capsys):
    assert main(["conformance", "--quick", "--ops", "fp8_gemm_nt", "per_token_cast_to_fp8"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_layouts_plot_writes_the_pictures(tmp_path, capsys):
    assert main(["layouts", "--plot", str(tmp_path)]) == 0
    written = capsys.readouterr().out.split()
    assert {p.rsplit("/", 1)[-1] for p in written} >= {"scale_layouts_m3_k512.png", "fp4_nibble_packing.png",
                                                       "nz_tiles.png"}
    for path in written:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_cli_user_errors_are_one_line_with_exit_code_2(capsys, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    for argv, fragment in ((["conformance", "--backend", "nope"], "'nope' is not registered"),
                           (["conformance", "--quick", "--ops", "nope"], "no conformance cases for ['nope']"),
                           (["conformance", "--backend", "nvidia", "--arch", "sm_100", "--quick"], "not one of"),
                           (["conformance", "--option", "archh"], "KEY=VALUE"),
                           (["layouts", "--plot", str(blocked / "sub")], "error:"),
                           (["demo", "--k", "0"], "--k must be a positive int")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_demo_prints_verdicts_legend_and_marks_emulated_times(capsys):
    assert main(["demo", "--m", "4", "--n", "128", "--k", "256"]) == 0
    out = capsys.readouterr().out
    assert "verdict:" in out and "cpu fp32-row-major: PASS" in out and "legend:" in out
    assert "(emulated)" in out


def test_demo_help_describes_every_option(capsys):
    import pytest
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    for option, words in (("--m", "tokens"), ("--n", "output features"), ("--k", "hidden size")):
        assert option in out and words in out


def test_layouts_without_matplotlib_is_a_one_line_error(capsys, monkeypatch, tmp_path):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main(["layouts", "--plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'portable-kernels[plot]'" in err and "Traceback" not in err
