"""The shared engine: copy an upstream test tree, rewrite it by explicit rules, run it, count.

One rule kept: the upstream file is changed only by the listed (pattern -> replacement) rules,
each with its reason, and a rule that no longer matches is reported, never silently dropped.
Assertions and thresholds are never the target of a rule.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Literal, Sequence

import attrs

log = logging.getLogger(__name__)

Outcome = Literal["passed", "failed", "hardware", "skipped", "out-of-scope"]
#: outcomes of a test that ran (hardware: failed for a reason no drop-in can provide); a whole file
#: classified hardware by a FileRule is counted under hw but not as run
RAN = ("passed", "failed", "hardware")


@attrs.frozen
class Rule:
    """Replace `pattern` (a regex, re.MULTILINE) by `replacement` in files matching `files` (globs).

    `required`: the rule is expected to match; when it matches nothing the report says so, as the
    upstream file has changed under it.
    """

    pattern: str
    replacement: str
    reason: str
    files: tuple[str, ...] = ("*.py",)
    required: bool = True

    def applies_to(self, rel_path: str) -> bool:
        return any(fnmatch.fnmatch(rel_path, g) or fnmatch.fnmatch(Path(rel_path).name, g) for g in self.files)


@attrs.frozen
class HardwareRule:
    """A failure whose first line matches `pattern` needs hardware no drop-in can provide."""

    pattern: str
    reason: str


@attrs.frozen
class FileRule:
    """A whole upstream file that is not run, with the reason (`hardware` or `out-of-scope`)."""

    file: str
    outcome: Literal["hardware", "out-of-scope"]
    reason: str


@attrs.frozen
class Program:
    """One run of a program-style upstream file: `python FILE ARGS` on `nodes` simulated nodes (its
    own `__main__` spawns its ranks; WORLD_SIZE / RANK / MASTER_* set as a multi-node launcher
    would); passed when every process exits 0."""

    file: str
    args: tuple[str, ...]
    name: str
    nodes: int = 1


@attrs.frozen
class Suite:
    """One upstream library's suite: what to copy, how to rewrite it, how to run it.

    copy:     (source relative to the checkout, destination relative to the tree) pairs; a folder
              copies its *.py files
    files:    the test files run (relative to the tree)
    kind:     "script" (call each top-level test_* function), "pytest", "cases" (the file's
              own driver lists its cases, a sample is run: cases.py), or "program" (`programs`)
    drivers:  kind "cases": the module whose DRIVERS maps each file's name to its CaseDriver
    """

    name: str
    copy: tuple[tuple[str, str], ...]
    files: tuple[str, ...]
    kind: Literal["script", "pytest", "cases", "program"]
    rules: tuple[Rule, ...]
    quick_rules: tuple[Rule, ...] = ()
    hardware: tuple[HardwareRule, ...] = ()
    skipped_files: tuple[FileRule, ...] = ()
    quick_env: tuple[tuple[str, str], ...] = ()
    drivers: str = ""
    programs: tuple[Program, ...] = ()


@attrs.frozen
class CaseResult:
    file: str
    name: str
    backend: str
    outcome: Outcome
    first_line: str = ""
    reason: str = ""
    seconds: float = 0.0
    ran: bool = True


@attrs.frozen
class Backend:
    """A `--backend` spec: `cpu`, `nvidia:arch=sm90`, `ascend:soc=950,scales=fp32`."""

    name: str
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, spec: str) -> "Backend":
        name, _, opts = spec.partition(":")
        if not name:
            raise ValueError(f"--backend {spec!r}: expected NAME[:KEY=VALUE,...]")
        options = []
        for item in filter(None, opts.split(",")):
            key, eq, value = item.partition("=")
            if not eq:
                raise ValueError(f"--backend {spec!r}: option {item!r} is not KEY=VALUE")
            options.append((key, value))
        return cls(name, tuple(options))

    @property
    def spec(self) -> str:
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in self.options) if self.options else "")

    def context(self):
        import portable_kernels

        return portable_kernels.use_backend(self.name, **dict(self.options))


def first_line(exc: BaseException) -> str:
    """`Type: first line of the message`, as the report shows a failure."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# ---------------------------------------------------------------------------------------------
# Rewriting
# ---------------------------------------------------------------------------------------------

def apply_rules(text: str, rel_path: str, rules: Sequence[Rule], hits: dict[int, int]) -> str:
    """`text` with every rule applying to `rel_path` substituted; `hits[id(rule)]` counts matches."""
    for rule in rules:
        if not rule.applies_to(rel_path):
            continue
        text, n = re.subn(rule.pattern, rule.replacement, text, flags=re.MULTILINE)
        hits[id(rule)] = hits.get(id(rule), 0) + n
    return text


def prepare_tree(suite: Suite, checkout: Path, dest: Path, quick: bool = False) -> list[str]:
    """Copy the suite's files from `checkout` into `dest` and rewrite them; the notes on stale rules."""
    rules = suite.rules + (suite.quick_rules if quick else ())
    hits: dict[int, int] = {}
    for src_rel, dst_rel in suite.copy:
        src = checkout / src_rel
        if not src.exists():
            raise FileNotFoundError(f"{suite.name}: {src} is not in the checkout {checkout}")
        if src.is_dir():
            pairs = [(p, Path(dst_rel) / p.relative_to(src)) for p in sorted(src.rglob("*.py"))]
        else:
            pairs = [(src, Path(dst_rel))]
        for path, rel in pairs:
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(apply_rules(path.read_text(), rel.as_posix(), rules, hits))
    notes = []
    for rule in rules:
        if rule.required and hits.get(id(rule), 0) == 0:
            notes.append(f"rule matched nothing (upstream changed?): {rule.pattern!r} in {', '.join(rule.files)}")
    return notes


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------

def _child_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH", "")]))
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    return env


def run_script_file(tree: Path, rel_file: str, backend: Backend, test_timeout: int, log_dir: Path,
                    env_extra: dict[str, str], drivers: str = "", sample: int = 0) -> list[CaseResult]:
    """Run one script-style file's test_* functions (or, with `drivers`, a case-list file's
    sampled cases) in a child process under `backend`."""
    out = log_dir / f"{Path(rel_file).stem}.{backend.spec.replace(':', '_').replace('=', '-')}.json"
    child = "_case_child" if drivers else "_child"
    cmd = [sys.executable, "-m", f"portable_kernels.tools.upstream_suites.{child}", str(tree / rel_file),
           backend.spec, str(out), str(test_timeout), *([drivers, str(sample)] if drivers else [])]
    env = _child_env(tree / Path(rel_file).parent) | env_extra
    with open(out.with_suffix(".log"), "w") as logf:
        proc = subprocess.run(cmd, cwd=tree / Path(rel_file).parent, env=env, stdout=logf,
                              stderr=subprocess.STDOUT)
    if out.exists():
        rows = json.loads(out.read_text())
        return [CaseResult(file=rel_file, backend=backend.spec, **row) for row in rows]
    tail = out.with_suffix(".log").read_text().strip().splitlines()[-1:] or ["(no output)"]
    return [CaseResult(rel_file, "<file>", backend.spec, "failed",
                       f"child exited {proc.returncode} before reporting: {tail[0][:300]}")]


def run_pytest_tree(tree: Path, paths: Sequence[str], backend: Backend, test_timeout: int, log_dir: Path,
                    sample: int, env_extra: dict[str, str]) -> list[CaseResult]:
    """Run pytest on the rewritten tree with the wrapping plugin; one result per test node."""
    tag = backend.spec.replace(":", "_").replace("=", "-")
    results_file = log_dir / f"pytest.{tag}.jsonl"
    env = _child_env(tree) | env_extra | {
        "PK_UPSTREAM_BACKEND": backend.spec,
        "PK_UPSTREAM_RESULTS": str(results_file),
        "PK_UPSTREAM_TIMEOUT": str(test_timeout),
        "PK_UPSTREAM_SAMPLE": str(sample),
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
           "portable_kernels.tools.upstream_suites._pytest_plugin", "-p", "no:benchmark", "-m", "not benchmark",
           "--rootdir", str(tree), *paths]
    with open(log_dir / f"pytest.{tag}.log", "w") as logf:
        subprocess.run(cmd, cwd=tree, env=env, stdout=logf, stderr=subprocess.STDOUT)
    rows = [json.loads(line) for line in results_file.read_text().splitlines()] if results_file.exists() else []
    if not rows:
        tail = (log_dir / f"pytest.{tag}.log").read_text().strip().splitlines()[-1:] or ["(no output)"]
        return [CaseResult(paths[0], "<pytest>", backend.spec, "failed", f"pytest reported nothing: {tail[0][:300]}")]
    return [CaseResult(backend=backend.spec, **row) for row in rows]


#: written at the root of a program suite's tree (on PYTHONPATH): every process the program spawns
#: enters the backend named by PK_UPSTREAM_BACKEND before the test code runs, and
#: torch.distributed.all_gather_into_tensor takes NCCL's stacked output [R, N, ...] on Gloo (which
#: wants it flat, [R * N, ...]; the same memory): a transport difference upstream tests call directly
SITECUSTOMIZE = """import os
import torch.distributed as _dist

_gather = _dist.all_gather_into_tensor


def _all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    if output_tensor.dim() == input_tensor.dim() + 1 and output_tensor.is_contiguous():
        output_tensor = output_tensor.view(-1, *output_tensor.shape[2:])
    return _gather(output_tensor, input_tensor, group=group, async_op=async_op)


_dist.all_gather_into_tensor = _all_gather_into_tensor
_spec = os.environ.get("PK_UPSTREAM_BACKEND", "cpu")
if _spec != "cpu":
    from portable_kernels.tools.upstream_suites.engine import Backend
    _backend = Backend.parse(_spec).context()  # kept: a collected context manager would reset it
    _backend.__enter__()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error_line(log_text: str) -> str:
    """The last `SomeError: message` line of a log (the failing rank's exception), else ''."""
    found = re.findall(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)(?:: .*)?)$", log_text, flags=re.MULTILINE)
    return found[-1].strip() if found else ""


def run_program(tree: Path, prog: Program, backend: Backend, test_timeout: int, log_dir: Path) -> CaseResult:
    """Run one Program under `backend`: its node processes at once, killed (whole process groups)
    past `test_timeout`."""
    import signal as _signal
    import time as _time

    tag = backend.spec.replace(":", "_").replace("=", "-")
    env = _child_env(tree) | {"PK_UPSTREAM_BACKEND": backend.spec, "MASTER_ADDR": "127.0.0.1",
                              "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(prog.nodes)}
    logs, procs = [], []
    start = _time.monotonic()
    for node in range(prog.nodes):
        path = log_dir / f"{Path(prog.file).stem}.{prog.name}.{tag}.node{node}.log"
        logs.append(path)
        with open(path, "w") as logf:
            procs.append(subprocess.Popen([sys.executable, str(tree / prog.file), *prog.args],
                                          cwd=tree / Path(prog.file).parent, env=env | {"RANK": str(node)},
                                          stdout=logf, stderr=subprocess.STDOUT, start_new_session=True))
    timed_out = False
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, test_timeout - (_time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for proc in procs:
            try:
                os.killpg(proc.pid, _signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    seconds = round(_time.monotonic() - start, 1)
    name = f"{prog.name} ({' '.join(prog.args)}{f'; {prog.nodes} nodes' if prog.nodes > 1 else ''})"
    if timed_out:
        return CaseResult(prog.file, name, backend.spec, "failed",
                          f"TimeoutError: over the per-test limit of {test_timeout} s on this machine", seconds=seconds)
    codes = [p.returncode for p in procs]
    if all(c == 0 for c in codes):
        return CaseResult(prog.file, name, backend.spec, "passed", seconds=seconds)
    line = next(filter(None, (_error_line(p.read_text(errors="replace")) for p in logs)), "")
    return CaseResult(prog.file, name, backend.spec, "failed", line or f"exit codes {codes}", seconds=seconds)


def classify(result: CaseResult, rules: Sequence[HardwareRule]) -> CaseResult:
    """A failure matching a hardware rule becomes `hardware` with the rule's reason."""
    if result.outcome != "failed":
        return result
    for rule in rules:
        if re.search(rule.pattern, result.first_line) or re.search(rule.pattern, result.name):
            return attrs.evolve(result, outcome="hardware", reason=rule.reason)
    return result


def run_suite(suite: Suite, checkout: Path, backends: Sequence[Backend], quick: bool = False,
              test_timeout: int = 600, sample: int = 0, workdir: Path | None = None,
              keep: bool = False) -> tuple[list[CaseResult], list[str]]:
    """Rewrite the suite from `checkout` into a temporary tree and run it under each backend."""
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=f"pk-upstream-{suite.name}-"))
    tree, log_dir = root / "tree", root / "logs"
    if tree.exists():
        shutil.rmtree(tree)
    log_dir.mkdir(parents=True, exist_ok=True)
    notes = prepare_tree(suite, checkout, tree, quick=quick)
    if suite.kind == "program":
        (tree / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env_extra = dict(suite.quick_env) if quick else {}
    results: list[CaseResult] = []
    for rule in suite.skipped_files:
        for backend in backends:
            results.append(CaseResult(rule.file, "<file>", backend.spec, rule.outcome, reason=rule.reason,
                                      ran=False))
    for backend in backends:
        log.info("%s under %s", suite.name, backend.spec)
        if suite.kind in ("script", "cases"):
            drivers = suite.drivers if suite.kind == "cases" else ""
            for rel in suite.files:
                results += run_script_file(tree, rel, backend, test_timeout, log_dir, env_extra, drivers, sample)
        elif suite.kind == "program":
            results += [run_program(tree, prog, backend, test_timeout, log_dir)
                        for prog in suite.programs if prog.file in suite.files]
        else:
            results += run_pytest_tree(tree, suite.files, backend, test_timeout, log_dir, sample, env_extra)
    results = [classify(r, suite.hardware) for r in results]
    notes.append(f"tree and logs: {root}")
    if not keep and workdir is None:
        shutil.rmtree(tree, ignore_errors=True)
        notes[-1] = f"logs: {log_dir}"
    return results, notes


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------

@attrs.frozen
class Count:
    run: int = 0
    passed: int = 0
    failed: int = 0
    hardware: int = 0
    skipped: int = 0


def summarize(results: Sequence[CaseResult]) -> dict[tuple[str, str], Count]:
    """(file, backend) -> counts, in first-seen order."""
    table: dict[tuple[str, str], dict[str, int]] = {}
    for r in results:
        row = table.setdefault((r.file, r.backend), dict.fromkeys(attrs.fields_dict(Count), 0))
        row["run"] += r.ran and r.outcome in RAN
        if r.outcome in RAN:
            row[r.outcome] += 1
        else:
            row["skipped"] += 1
    return {k: Count(**v) for k, v in table.items()}


def format_report(suite_name: str, results: Sequence[CaseResult], notes: Sequence[str] = ()) -> str:
    """The text table: per file and backend run/passed/failed/hardware/skipped, then the failures."""
    lines = [f"== {suite_name} =="]
    header = f"{'file':58} {'backend':18} {'run':>5} {'pass':>5} {'fail':>5} {'hw':>4} {'skip':>5}"
    lines += [header, "-" * len(header)]
    total = dict.fromkeys(attrs.fields_dict(Count), 0)
    for (file, backend), c in summarize(results).items():
        lines.append(f"{file:58} {backend:18} {c.run:5} {c.passed:5} {c.failed:5} {c.hardware:4} {c.skipped:5}")
        for k in total:
            total[k] += getattr(c, k)
    lines.append(f"{'total':58} {'':18} {total['run']:5} {total['passed']:5} {total['failed']:5} "
                 f"{total['hardware']:4} {total['skipped']:5}")
    for outcome, title in (("failed", "failures"), ("hardware", "needs hardware no drop-in provides"),
                           ("out-of-scope", "out of scope"), ("skipped", "skipped")):
        picked = [r for r in results if r.outcome == outcome]
        if not picked:
            continue
        lines.append(f"-- {title} --")
        for r in picked:
            detail = r.first_line if outcome == "failed" else (r.reason or r.first_line)
            if outcome == "hardware" and r.first_line:
                detail = f"{r.reason} [{r.first_line}]"
            lines.append(f"  {r.file}::{r.name} [{r.backend}]: {detail[:400]}")
    for note in notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def to_json(suite_name: str, checkout: Path, commit: str, results: Sequence[CaseResult],
            notes: Sequence[str]) -> dict:
    return {
        "suite": suite_name,
        "checkout": str(checkout),
        "commit": commit,
        "summary": [{"file": f, "backend": b, **attrs.asdict(c)} for (f, b), c in summarize(results).items()],
        "results": [attrs.asdict(r) for r in results],
        "notes": list(notes),
    }
