"""The command line: demo, doctor and conformance."""

from __future__ import annotations

from portable_kernels.__main__ import main
from portable_kernels.tools.demo import MlaShape, MoeShape, run_demo, runnable_targets


SMALL_DEMO = ["demo", "--tokens", "16", "--hidden", "256", "--experts", "8", "--seqlen", "128", "--repeats", "1"]


def test_demo_prints_a_row_per_runnable_backend(capsys):
    assert main(SMALL_DEMO) == 0
    out = capsys.readouterr().out
    assert "MoE layer" in out and "MLA decode" in out
    for name, _, options in runnable_targets():
        label = name + ("[" + ",".join(f"{k}={v}" for k, v in sorted(options.items())) + "]" if options else "")
        assert f"\n{label} " in out, label


def test_demo_runs_the_same_model_code_on_every_backend_with_nothing_converted():
    runs = run_demo(MoeShape(tokens=16, hidden=256, experts=8), MlaShape(seqlen=128), repeats=1)
    assert runs[0].backend == "cpu" and runs[0].moe_diff == 0.0
    for run in runs:
        if run.skipped:  # a backend without the demo's ops (e.g. a partial plugin) is reported, not run
            assert run.backend not in ("cpu", "nvidia", "ascend")
            continue
        assert run.passed and run.conversions == 0, run
        assert {"m_grouped_fp8_gemm_nt_contiguous", "top2_sum_gate", "flash_mla_with_kvcache"} <= set(run.providers)
        assert run.weight_bytes > 0 and run.weight_format


def test_demo_plot_draws_every_backends_weight_bytes(tmp_path, capsys):
    assert main([*SMALL_DEMO, "--plot", str(tmp_path)]) == 0
    with open(tmp_path / "weight_formats.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


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
                           (["demo", "--tokens", "0"], "--tokens must be a positive int")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_demo_prints_providers_verdicts_legend_and_marks_emulated_times(capsys):
    assert main(SMALL_DEMO) == 0
    out = capsys.readouterr().out
    assert "providers that ran:" in out and "verdict:" in out and "cpu: PASS" in out and "legend:" in out
    assert "(emulated)" in out


def test_demo_help_describes_every_option(capsys):
    import pytest
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    for option, words in (("--tokens", "tokens"), ("--hidden", "hidden size"), ("--experts", "experts"),
                          ("--seqlen", "cached sequence"), ("--plot", "byte layouts")):
        assert option in out and words in out


def test_layouts_without_matplotlib_is_a_one_line_error(capsys, monkeypatch, tmp_path):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main(["layouts", "--plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'portable-kernels[plot]'" in err and "Traceback" not in err
