"""deepjit stands alone: it imports only the standard library (pybind11 and runtimes lazily)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import deepjit

PACKAGE = Path(deepjit.__file__).parent
ALLOWED_LAZY = {"pybind11"}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_every_import_is_stdlib_or_an_optional_lazy_one():
    for path in sorted(PACKAGE.glob("*.py")):
        foreign = {r for r in _imported_roots(path) if r not in sys.stdlib_module_names} - ALLOWED_LAZY
        assert foreign == set(), f"{path.name} imports {foreign}"


def test_importing_deepjit_loads_no_project_or_third_party_module():
    script = (
        "import sys, deepjit\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'portable_kernels', 'torch', 'pybind11', 'numpy', 'cuda', 'attrs'})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""
