"""`python -m portable_kernels bench`: the cases, the runner, the JSON document, plots, --compare and
the command line's errors. Runs the tiny case set only (seconds); never asserts on a time."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

import portable_kernels as pk
from portable_kernels.__main__ import main
from portable_kernels.tools.bench import (
    FAMILIES,
    SCHEMA,
    SIZES,
    BenchUsageError,
    Case,
    Inputs,
    Target,
    cases_of,
    format_compare,
    format_table,
    load_run,
    resolve_targets,
    run_bench,
    run_case,
    write_outputs,
)
from portable_kernels.tools.bench.timing import Spread, paired_rounds, rotated_rounds, synchronizer

ROOT = Path(__file__).resolve().parents[2]
TINY = {"size": "tiny", "rounds": 2, "min_seconds": 0.001, "progress": "none"}

CASE_FIELDS = {"family", "case", "shape", "op", "peer", "backend", "options", "device", "emulation", "threads", "date",
               "target", "limit_us", "target_source", "provider", "providers", "op_seconds", "peer_seconds", "ratio",
               "op_calls", "peer_calls", "met", "bytes_moved", "op_gbps", "peer_gbps", "peak_mib", "note", "skipped",
               "error"}
SPREAD_FIELDS = {"median", "min", "max", "q1", "q3", "samples"}
CPU_TARGET = Target("cpu", {}, torch.device("cpu"), False)


@pytest.fixture(scope="module")
def tiny_run() -> dict:
    """Every family's tiny cases on the cpu backend, once for the module."""
    return run_bench(backends=["cpu"], **TINY)


def _strict_json(text: str) -> dict:
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


# -- the cases ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_has_cases_in_every_set_and_quick_is_part_of_full(family):
    for size in SIZES:
        assert cases_of(family, size), (family, size)
    full = {c.label for c in cases_of(family, "full")}
    assert {c.label for c in cases_of(family, "quick")} <= full


@pytest.mark.parametrize("family", list(FAMILIES))
def test_case_labels_are_unique_within_a_set(family):
    for size in SIZES:
        labels = [c.label for c in cases_of(family, size)]
        assert len(labels) == len(set(labels)), labels


def test_unknown_case_set_is_refused():
    with pytest.raises(ValueError, match="unknown case set 'huge'"):
        cases_of("gemm", "huge")


# -- timing ------------------------------------------------------------------------------------------------

def test_spread_holds_median_min_max_and_quartiles():
    s = Spread.of([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s.median, s.min, s.max, s.q1, s.q3) == (3.0, 1.0, 5.0, 2.0, 4.0)
    assert Spread.of([7.0]).q1 == Spread.of([7.0]).q3 == 7.0


def test_paired_rounds_time_both_sides_every_round_and_sync_around_each_batch():
    calls = {"op": 0, "peer": 0, "sync": 0}

    def count(name):
        return lambda: calls.__setitem__(name, calls[name] + 1)

    timed = paired_rounds(count("op"), count("peer"), count("sync"), rounds=3, min_seconds=1e-4)
    assert len(timed.op.samples) == len(timed.peer.samples) == len(timed.ratio.samples) == 3
    # per side: two sizing calls, then 3 batches; every batch and sizing call synced at both ends
    assert calls["op"] == 2 + 3 * timed.op_calls and calls["peer"] == 2 + 3 * timed.peer_calls
    assert calls["sync"] == 2 * 2 + 2 * 2 * 3
    assert all(r > 0 for r in timed.ratio.samples)


def test_rotated_rounds_warm_each_side_once_and_rotate_who_goes_first():
    order = []
    ticks = iter(range(1000))
    sides = {name: (lambda name=name: order.append(name)) for name in "abc"}
    seconds = rotated_rounds(sides, rounds=3, clock=lambda: next(ticks))
    assert order[:3] == list("abc")                                   # the warm-up calls
    assert order[3:] == list("abc") + list("bca") + list("cab")       # the first side rotates
    assert {k: len(v) for k, v in seconds.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t == 1 for v in seconds.values() for t in v)          # one clock tick around each call
    with pytest.raises(ValueError, match="rounds"):
        rotated_rounds(sides, rounds=0)


def test_cpu_needs_no_sync_and_an_unknown_device_type_is_refused():
    synchronizer(torch.device("cpu"))()
    with pytest.raises(ValueError, match="synchronize"):
        synchronizer(torch.device("meta"))


# -- the runner and its document ---------------------------------------------------------------------------

def test_tiny_run_measures_every_case_on_cpu_with_the_provider_that_ran(tiny_run):
    records = tiny_run["cases"]
    expected = sum(len(cases_of(f, "tiny")) for f in FAMILIES)
    assert len(records) == expected
    assert [r for r in records if r["skipped"] or r["error"]] == []
    for r in records:
        assert r["provider"], r
        if r["family"] != "layouts":
            assert r["backend"] == "cpu", r
        # those call no public op (the model's load only prepares weights)
        if r["family"] != "layouts" and r["case"] not in ("topk provider", "load"):
            assert r["providers"] and all(p.split("/")[1] == "cpu" for p in r["providers"]), r
    assert {r["family"] for r in records} == set(FAMILIES)


def test_tiny_run_json_has_every_field(tiny_run, tmp_path):
    paths = write_outputs(tiny_run, tmp_path)
    doc = _strict_json((tmp_path / "bench.json").read_text())
    assert tmp_path / "bench.json" in paths and (tmp_path / "table.txt").read_text().strip()
    assert doc["schema"] == SCHEMA
    assert {"cpu", "cores", "cores_usable", "load_average", "load_average_end", "os", "accelerators"} <= set(
        doc["machine"])
    assert doc["machine"]["cores"] >= 1 and len(doc["machine"]["load_average"]) == 3
    assert {"torch", "portable_kernels", "git_commit", "python"} <= set(doc["versions"])
    assert doc["versions"]["torch"] == torch.__version__ and doc["versions"]["portable_kernels"] == pk.__version__
    assert doc["settings"]["size"] == "tiny" and doc["settings"]["rounds"] == 2
    for r in doc["cases"]:
        assert set(r) == CASE_FIELDS, set(r) ^ CASE_FIELDS
        for side in ("op_seconds", "peer_seconds", "ratio"):
            assert set(r[side]) == SPREAD_FIELDS and len(r[side]["samples"]) == 2
            assert r[side]["min"] <= r[side]["median"] <= r[side]["max"]
        assert r["threads"] == torch.get_num_threads() and r["date"] and r["device"] == "cpu"
        assert r["emulation"] is False
    assert doc["summary"]["cases"] == len(doc["cases"]) == doc["summary"]["measured"]


def test_tiny_cases_judge_no_target(tiny_run):
    """Targets belong to the shapes an issue named: the tiny set only tests the machinery."""
    assert all(r["target"] is None and r["met"] is None for r in tiny_run["cases"])


def test_layout_cases_report_bytes_and_which_encoder_ran(tiny_run):
    layouts = [r for r in tiny_run["cases"] if r["family"] == "layouts"]
    assert {r["provider"] for r in layouts} >= {"torch encoder"}
    for r in layouts:
        assert r["bytes_moved"] > 0 and r["op_gbps"] > 0 and r["backend"] is None


def test_memory_cases_record_peak_growth(tiny_run):
    memory = [r for r in tiny_run["cases"] if r["peak_mib"] is not None]
    assert memory, "the tiny set has a case that measures memory"
    assert set(memory[0]["peak_mib"]) == {"op", "peer"}


def test_table_lists_every_case_and_its_provider(tiny_run):
    table = format_table(tiny_run)
    for r in tiny_run["cases"]:
        assert f"{r['case']} {r['shape']}" in table
    assert "native" in table


def test_a_backend_in_emulation_is_labelled_and_judged_against_no_target():
    doc = run_bench(backends=["nvidia"], families=["topk"], **TINY)
    assert doc["settings"]["targets"][0]["emulation"] is True
    for r in doc["cases"]:
        assert r["emulation"] is True and r["backend"] == "nvidia" and r["target"] is None
    assert doc["summary"]["emulated"] == len(doc["cases"])
    table = format_table(doc)
    assert "nvidia*" in table


def test_default_backends_run_natively_here():
    targets = resolve_targets(None)
    assert "cpu" in [t.backend for t in targets]
    assert not any(t.emulation for t in targets)


def test_backend_options_are_parsed_and_checked():
    (target,) = resolve_targets(["nvidia:arch=sm100"])
    assert target.options == {"arch": "sm100"} and target.emulation
    with pytest.raises(pk.ContractError, match="sm70"):
        resolve_targets(["nvidia:arch=sm70"])


def test_case_filter_selects_by_label():
    doc = run_bench(backends=["cpu"], families=["topk"], match=["provider"], **TINY)
    assert doc["cases"] and all("provider" in r["case"] for r in doc["cases"])
    with pytest.raises(BenchUsageError, match="no case"):
        run_bench(backends=["cpu"], families=["topk"], match=["no such case"], **TINY)


def test_plain_progress_prints_one_line_per_case(capsys):
    run_bench(backends=["cpu"], families=["casts"], **{**TINY, "progress": "plain"})
    err = capsys.readouterr().err.splitlines()
    n = len(cases_of("casts", "tiny"))
    assert len([line for line in err if line.startswith("[")]) == n
    assert err[-1].startswith(f"[{n}/{n}]")


def test_tqdm_progress_when_installed(capsys):
    pytest.importorskip("tqdm")
    run_bench(backends=["cpu"], families=["casts"], **{**TINY, "progress": "tqdm"})
    assert "case" in capsys.readouterr().err


# -- a case that fails -------------------------------------------------------------------------------------

def _case(op) -> Case:
    return Case("gemm", "probe", "1x1", lambda device: Inputs(x=torch.ones(1, device=device)), op, lambda i: i.x + 1,
                "probe", "x + 1")


def test_a_case_the_backend_declines_is_skipped_with_the_reason():
    def declined(i):
        raise pk.NoKernelError("probe", "cpu", {"native": ["shape too odd"]})
    rec = run_case(_case(declined), CPU_TARGET, 1, rounds=1, min_seconds=1e-4)
    assert rec["skipped"].startswith("NoKernelError") and rec["ratio"] is None and rec["error"] is None


def test_a_broken_case_is_an_error_and_the_record_says_why():
    def broken(i):
        raise RuntimeError("kaboom")
    rec = run_case(_case(broken), CPU_TARGET, 1, rounds=1, min_seconds=1e-4)
    assert rec["error"] == "RuntimeError: kaboom" and rec["skipped"] is None


def test_a_case_for_another_device_is_skipped():
    case = Case("gemm", "probe", "1x1", lambda d: Inputs(), lambda i: None, lambda i: None, "probe", "none",
                devices=("cuda",))
    assert run_case(case, CPU_TARGET, 1, rounds=1, min_seconds=1e-4)["skipped"] == "the case runs on cuda only"


def test_a_case_reports_the_provider_it_names_when_no_registry_op_ran():
    case = Case("layouts", "probe", "1x1", lambda d: Inputs(x=torch.ones(4), provider="hand-written"),
                lambda i: i.x.clone(), lambda i: i.x.clone(), "clone", "clone")
    assert run_case(case, CPU_TARGET, 1, rounds=1, min_seconds=1e-4)["provider"] == "hand-written"


# -- plots, --compare and the command line -----------------------------------------------------------------

def test_a_plot_per_family_when_matplotlib_is_present(tiny_run, tmp_path):
    pytest.importorskip("matplotlib")
    write_outputs(tiny_run, tmp_path)
    for family in FAMILIES:
        with open(tmp_path / f"{family}.png", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", family


def _two_runs(tiny_run, tmp_path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    write_outputs(tiny_run, a)
    later = json.loads(json.dumps(tiny_run))
    later["date"] = "2099-01-01T00:00:00+00:00"
    for r in later["cases"]:
        r["ratio"] = {k: [2 * x for x in v] if k == "samples" else 2 * v for k, v in r["ratio"].items()}
    write_outputs(later, b)
    return a / "bench.json", b / "bench.json"


def test_compare_pairs_the_cases_of_two_runs(tiny_run, tmp_path):
    a, b = _two_runs(tiny_run, tmp_path)
    text = format_compare(load_run(a), load_run(b))
    assert f"{len(tiny_run['cases'])} cases in both runs" in text
    first = tiny_run["cases"][0]
    line = next(line for line in text.splitlines() if f"{first['case']} {first['shape']}" in line)
    assert f"{first['ratio']['median']:.2f}" in line and f"{2 * first['ratio']['median']:.2f}" in line


def test_compare_cli_prints_the_table_and_draws_a_plot_per_family(tiny_run, tmp_path, capsys):
    a, b = _two_runs(tiny_run, tmp_path)
    out = tmp_path / "cmp"
    assert main(["bench", "--compare", str(a), str(b.parent), "--out", str(out)]) == 0
    assert "cases in both runs" in capsys.readouterr().out
    if importlib.util.find_spec("matplotlib") is not None:
        assert sorted(p.name for p in out.iterdir()) == sorted(f"compare-{f}.png" for f in FAMILIES)


def test_cli_runs_writes_its_files_and_prints_the_summary(tmp_path, capsys):
    rc = main(["bench", "--backend", "cpu", "--family", "topk", "--tiny", "--rounds", "1", "--min-time", "0.001",
               "--no-progress", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "cases measured" in out and f"wrote {tmp_path / 'bench.json'}" in out
    doc = load_run(tmp_path)
    assert doc["command"].startswith("python -m portable_kernels bench --backend cpu")
    assert all(math.isfinite(r["ratio"]["median"]) for r in doc["cases"])


@pytest.mark.parametrize("args, message", [
    (["--backend", "nosuch"], "unknown backend 'nosuch'"),
    (["--backend", "nvidia:arch"], "--backend takes NAME or NAME:KEY=VALUE"),
    (["--backend", "nvidia:arch=sm70"], "sm70"),
    (["--family", "nosuch"], "unknown family 'nosuch'"),
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--min-time", "0"], "--min-time must be > 0"),
    (["--threads", "1,x"], "--threads takes a comma-separated list"),
    (["--threads", "0"], "--threads takes a comma-separated list"),
    (["--case", "no such case"], "no case of the tiny set matches"),
])
def test_cli_user_errors_are_one_line_with_exit_status_2(args, message, tmp_path, capsys):
    assert main(["bench", "--tiny", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("portable_kernels bench: error: ") and message in err and err.count("\n") == 1


def test_cli_refuses_an_output_folder_that_is_a_file_before_running(tmp_path, capsys):
    target = tmp_path / "a-file"
    target.write_text("")
    assert main(["bench", "--tiny", "--out", str(target)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_cli_compare_refuses_files_that_are_not_bench_results(tmp_path, capsys):
    not_json, other = tmp_path / "x.json", tmp_path / "y.json"
    not_json.write_text("{")
    other.write_text('{"schema": "something/else"}')
    assert main(["bench", "--compare", str(not_json), str(other)]) == 2
    assert "is not JSON" in capsys.readouterr().err
    assert main(["bench", "--compare", str(other), str(other)]) == 2
    assert "is not a bench result" in capsys.readouterr().err
    assert main(["bench", "--compare", str(tmp_path / "missing.json"), str(other)]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_the_benchmark_scripts_are_thin_calls_into_the_bench_command():
    spec = importlib.util.spec_from_file_location("cpu_bench", ROOT / "benchmarks" / "cpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.argv(["--quick"])[:3] == ["bench", "--backend", "cpu"] and "--threads" in module.argv([])
    assert module.argv(["--threads", "2"]).count("--threads") == 1
    for script in ("cpu_bench.py", "layouts_bench.py"):
        assert len((ROOT / "benchmarks" / script).read_text().splitlines()) < 40, script
