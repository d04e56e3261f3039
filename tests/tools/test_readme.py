"""The README's quick start really runs, and its test command is the one .ci/run runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_quick_start_runs():
    code = _blocks("python")[0]
    exec(compile(code, "README.md quick start", "exec"), {"__name__": "readme"})


def test_ci_runs_the_readme_test_command():
    test_command = next(b for b in _blocks("bash") if "pytest" in b).strip()
    assert test_command in (ROOT / ".ci" / "run").read_text()
