"""benchmarks/device_check_ascend.py --dry-run: the NPU owner's script runs end to end on CPU against the
stand-in, writes its report with every section, and claims no NPU timing (everything it would time is
labelled "stand-in, not timed on an NPU")."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "device_check_ascend.py"
SECTIONS = ("environment", "conformance", "byte identity", "mc2 row order", "timings", "summary")
STAND_IN = "stand-in, not timed on an NPU"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    report = tmp_path_factory.mktemp("device-check") / "ascend-dry-run.log"
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--soc", "910b", "--report", str(report)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return done, report.read_text() if report.exists() else ""


def test_dry_run_passes_and_writes_its_report(dry_run):
    done, text = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "checks: all passed" in text


def test_dry_run_report_has_every_section_in_order(dry_run):
    _, text = dry_run
    positions = [text.find(f"\n== {name} (") for name in SECTIONS]
    assert all(p >= 0 for p in positions), dict(zip(SECTIONS, positions))
    assert positions == sorted(positions)


def test_dry_run_reports_providers_formats_and_the_row_order(dry_run):
    _, text = dry_run
    assert "torch_npu-dequantized" in text and "providers" in text          # conformance with providers
    for fmt in ("ascend-dequantized-bf16", "ascend-mx-ue8m0-kmajor-pairs", "ascend-fp8-kv-nope-rope-scales"):
        assert f"{fmt}" in text and "DIFFERENT" not in text
    assert text.count("rank 0 (2 Gloo ranks") == 1 and "FAIL" not in text  # the MC2 self-test ran at 2 ranks


def test_dry_run_claims_no_npu_timing(dry_run):
    _, text = dry_run
    timing = text[text.find("\n== timings ("):text.find("\n== summary (")]
    rows = [line for line in timing.splitlines() if line.strip() and not line.startswith("==")]
    assert rows and all(STAND_IN in line for line in rows), rows
    assert " us " not in timing and "met " not in text and "missed " not in text
    summary = text[text.find("\n== summary ("):]
    assert all(STAND_IN in line for line in summary.splitlines() if line.startswith("n/a"))
