"""The layering rules of DESIGN.md, checked by parsing every import in the source tree."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: source folder -> the package name it installs as
PACKAGES = {"portable_kernels": "portable_kernels", "layouts": "portable_kernels.layouts",
            "backends": "portable_kernels.backends", "deepjit": "deepjit"}
STDLIB = set(sys.stdlib_module_names)


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    package = PACKAGES[parts[0]]
    tail = parts[1:]
    if tail and tail[-1] == "__init__":
        tail = tail[:-1]
    return ".".join([package, *tail])


def _imports(path: Path, module: str | None = None) -> list[str]:
    """Absolute names of every module the file imports (relative imports resolved)."""
    module = module or _module_of(path)
    is_package = path.name == "__init__.py"
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            if node.module is None or node.level:
                names += [f"{prefix}.{alias.name}" for alias in node.names] if node.module is None else [prefix]
            else:
                names.append(prefix)
    return names


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _violations(folder: str, allowed) -> list[str]:
    out = []
    for path in _files(folder):
        for name in _imports(path):
            if not allowed(path, name):
                out.append(f"{path.relative_to(ROOT)} imports {name}")
    return out


def _top(name: str) -> str:
    return name.split(".")[0]


def test_semantic_layer_imports_no_backend():
    def allowed(path, name):
        return not name.startswith("portable_kernels.backends")
    assert _violations("portable_kernels", allowed) == []


#: what each part of the semantic layer may not import: the machinery names no op family, tool or
#: drop-in; an op family names no tool, drop-in or model path (they are built on the ops, not below them)
LAYER_RULES = {
    "portable_kernels/core": ("portable_kernels.ops", "portable_kernels.tools", "portable_kernels.models",
                              "portable_kernels.torch_ops", "portable_kernels.deep_gemm", "portable_kernels.flash_mla",
                              "portable_kernels.tile_kernels", "portable_kernels.deep_select",
                              "portable_kernels.deep_ep"),
    "portable_kernels/ops": ("portable_kernels.tools", "portable_kernels.models", "portable_kernels.torch_ops",
                             "portable_kernels.deep_gemm", "portable_kernels.flash_mla", "portable_kernels.tile_kernels",
                             "portable_kernels.deep_select", "portable_kernels.deep_ep"),
}


@pytest.mark.parametrize("folder", sorted(LAYER_RULES))
def test_the_machinery_and_the_ops_do_not_reach_up(folder):
    banned = LAYER_RULES[folder]

    def allowed(path, name):
        return not any(name == b or name.startswith(b + ".") for b in banned)
    assert _violations(folder, allowed) == []


def test_layouts_import_torch_and_stdlib_only():
    def allowed(path, name):
        return _top(name) in STDLIB | {"torch"} or name.startswith("portable_kernels.layouts")
    assert _violations("layouts", allowed) == []


def test_deepjit_imports_nothing_of_portable_kernels():
    def allowed(path, name):
        return _top(name) != "portable_kernels"
    assert _violations("deepjit", allowed) == []


def test_no_backend_imports_another_backend():
    def allowed(path, name):
        own = "portable_kernels.backends." + path.relative_to(ROOT / "backends").parts[0]
        if not name.startswith("portable_kernels.backends."):
            return True
        return name == own or name.startswith(own + ".")
    assert _violations("backends", allowed) == []


@pytest.mark.parametrize("folder", list(PACKAGES) + ["tests", "benchmarks"])
def test_nothing_imports_layouts_or_backends_as_top_level_names(folder):
    if not (ROOT / folder).exists():
        pytest.skip(f"{folder}/ does not exist")
    offenders = [f"{p.relative_to(ROOT)}: {n}" for p in _files(folder) if folder in PACKAGES
                 for n in _imports(p) if _top(n) in ("layouts", "backends")]
    offenders += [f"{p.relative_to(ROOT)}: {n}" for p in _files(folder) if folder not in PACKAGES
                  for n in _plain_imports(p) if _top(n) in ("layouts", "backends")]
    assert offenders == []


def _plain_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module)
    return names


def test_the_checker_resolves_relative_imports(tmp_path):
    """Guard against a checker that cannot fail: a relative import of a backend is seen as one."""
    probe = tmp_path / "probe.py"
    probe.write_text("from .backends import cpu\nfrom ..backends.nvidia import x\n")
    assert _imports(probe, "portable_kernels.probe")[0] == "portable_kernels.backends"
    assert _imports(probe, "portable_kernels.sub.probe")[1] == "portable_kernels.backends.nvidia"
