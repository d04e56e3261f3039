"""Old internal import paths, kept for one release (0.1 -> 0.2) after the move into core/, ops/ and tools/.

`import portable_kernels.gemm` (or any submodule of a moved package) still works: an import hook
answers it with the module at its new place (the same module object, so classes and registries are
shared) and warns once per old name with a DeprecationWarning naming the new path. Two old names,
`portable_kernels.topk` and `portable_kernels.block_cast`, are also public functions of the package;
importing a module under those names would replace the function attribute, so they are bound to
their new modules in `sys.modules` when the package loads, without a warning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: old module path -> new module path (a package's submodules follow their package)
MOVED: dict[str, str] = {
    **{f"portable_kernels.{name}": f"portable_kernels.core.{name}" for name in (
        "contract", "registry", "dispatch", "providers", "tensors", "formats", "prepare", "conversions",
        "checks", "compiled", "packed_scales", "oracle", "numerics", "native")},
    "portable_kernels.contiguous_layout": "portable_kernels.core.alignment",
    "portable_kernels.gemm": "portable_kernels.ops.gemm.dense",
    "portable_kernels.gemm_transposed": "portable_kernels.ops.gemm.transposed",
    "portable_kernels.grouped_gemm": "portable_kernels.ops.gemm.grouped",
    "portable_kernels.grouped_fp4": "portable_kernels.ops.gemm.grouped_fp4",
    "portable_kernels.k_grouped_gemm": "portable_kernels.ops.gemm.k_grouped",
    "portable_kernels.fp4": "portable_kernels.ops.quant.fp4",
    "portable_kernels.quantization": "portable_kernels.ops.quant.fp8",
    "portable_kernels.swiglu": "portable_kernels.ops.swiglu",
    "portable_kernels.mla": "portable_kernels.ops.attention.decode",
    "portable_kernels.mla_extras": "portable_kernels.ops.attention.extensions",
    "portable_kernels.attention": "portable_kernels.ops.attention.prefill",
    "portable_kernels.moe_routing": "portable_kernels.ops.moe_routing",
    "portable_kernels.ep.cost": "portable_kernels.tools.ep_cost",
    "portable_kernels.ep": "portable_kernels.ops.ep",
    "portable_kernels.bench": "portable_kernels.tools.bench",
    "portable_kernels.demo": "portable_kernels.tools.demo",
    "portable_kernels.plots": "portable_kernels.tools.plots",
    "portable_kernels.backends.cpu.native": "portable_kernels.backends.cpu.providers",
    # the MC2 engine is chip code: it moved to the ascend backend
    "portable_kernels.ops.ep.mc2_engine": "portable_kernels.backends.ascend.vendor.mc2",
    "portable_kernels.ep.mc2_engine": "portable_kernels.backends.ascend.vendor.mc2",
}
#: stable public names that live elsewhere now: aliased without a warning
STABLE: dict[str, str] = {"portable_kernels.errors": "portable_kernels.core.errors",
                           "portable_kernels.ep": "portable_kernels.ops.ep"}
#: old module names that are also public functions of the package (see the module docstring)
SHADOWED: dict[str, str] = {"portable_kernels.topk": "portable_kernels.ops.topk",
                            "portable_kernels.block_cast": "portable_kernels.ops.quant.block_cast"}


def old_attribute(package: ModuleType, name: str) -> ModuleType:
    """`portable_kernels.<name>` as an attribute, for a module that used to live there (the package's
    __getattr__): imported under its old path, so it warns as the import would."""
    old = f"{package.__name__}.{name}"
    if old in sys.modules or new_name(old) is not None:
        return importlib.import_module(old)
    raise AttributeError(f"module {package.__name__!r} has no attribute {name!r}")


def new_name(old: str) -> str | None:
    """The module path `old` moved to, or None if it did not move."""
    table = {**MOVED, **STABLE}
    best = max((o for o in table if old == o or old.startswith(o + ".")), key=len, default=None)
    return None if best is None else table[best] + old[len(best):]


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str, warn: bool) -> None:
        self.target, self.warn = target, warn

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        if self.warn:
            warnings.warn(f"{spec.name} moved to {self.target}; the old path works until portable_kernels 0.2",
                          DeprecationWarning, stacklevel=6)
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The target module is already executed; give it back the spec the import machinery replaced."""
        module.__spec__ = self.spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers imports of old module paths with the modules at their new paths."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("portable_kernels.") or fullname in sys.modules:
            return None
        new = new_name(fullname)
        if new is None:
            return None
        is_pkg = hasattr(importlib.import_module(new), "__path__")
        return importlib.machinery.ModuleSpec(fullname, _Alias(new, fullname not in STABLE), is_package=is_pkg)


def install() -> None:
    """Put the finder on sys.meta_path (once) and bind the shadowed names."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        # first: the path finder would otherwise load a moved package's submodule a second time
        sys.meta_path.insert(0, MovedModuleFinder())
    for old, new in {**SHADOWED, **STABLE}.items():
        sys.modules.setdefault(old, importlib.import_module(new))
