"""Every package folder of the source tree is listed in pyproject.toml, so a wheel ships it
(setuptools is given an explicit list because of the package-dir mapping)."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11; the project also runs on 3.10

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = {"portable_kernels": "portable_kernels", "layouts": "portable_kernels.layouts",
                "backends": "portable_kernels.backends", "deepjit": "deepjit"}


def _packages_in_tree() -> set[str]:
    found = set()
    for folder, name in SOURCE_ROOTS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([name, *rel]))
    return found


def test_every_package_folder_is_listed_for_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(config["packages"]) == _packages_in_tree()


def test_package_dir_maps_the_mission_folders():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {name: folder for folder, name in SOURCE_ROOTS.items()}
