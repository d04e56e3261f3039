"""Fixtures for the deepjit tests: a private cache per test, a clean knob environment, fake compilers.

Every test gets its own cache root through DEEPJIT_CACHE_DIR and a fresh JitContext, so no test
sees another's in-process or on-disk results. Tiny extern "C" sources keep most builds well under
a second; the one pybind11 module is built once per module that needs it.
"""

from __future__ import annotations

import os
import shutil
import stat
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import deepjit
from deepjit import cache

GXX = shutil.which("g++")
NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
)

ADD_SOURCE = 'extern "C" int add(int a, int b) { return a + b + OFFSET; }\n'


@pytest.fixture(autouse=True)
def clean_knobs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Unset every deepjit/PK_JIT knob and point the cache at a private folder; returns that folder."""
    for variable in list(os.environ):
        if variable.startswith(("DEEPJIT_", "PK_JIT_")):
            monkeypatch.delenv(variable)
    monkeypatch.delenv("CXX", raising=False)
    root = tmp_path / "cache"
    monkeypatch.setenv("DEEPJIT_CACHE_DIR", str(root))
    return root


@pytest.fixture
def cache_root(clean_knobs: Path) -> Path:
    return clean_knobs


@pytest.fixture
def jit() -> deepjit.JitContext:
    return deepjit.JitContext()


def entries(root: Path, name: str | None = None) -> list[cache.Entry]:
    return [e for e in cache.iter_entries(root) if name is None or e.name == name]


def leftovers(root: Path) -> list[Path]:
    folder = root / cache.TMP_DIR
    return sorted(folder.iterdir()) if folder.is_dir() else []


@pytest.fixture
def make_script(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write an executable /bin/sh script into tmp_path/bin and return its path."""

    def make(name: str, body: str) -> Path:
        folder = tmp_path / "bin"
        folder.mkdir(exist_ok=True)
        path = folder / name
        path.write_text("#!/bin/sh\n" + textwrap.dedent(body).lstrip())
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path

    return make


@pytest.fixture
def wrapped_gxx(make_script: Callable[[str, str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A g++ wrapper installed as DEEPJIT_CXX. It reports g++'s own --version (same compiler
    identity), logs each real compile to calls.log, and misbehaves while a control file exists:
    `fail` -> exit 1, `hang` -> write half an output and sleep, `sleep` -> pause before compiling,
    `wait` -> touch `started` and wait for `continue`, `rmcwd` -> delete its working folder once
    (like a clean-up racing the build), `rmcwd_always` -> every time."""
    control = tmp_path / "control"
    control.mkdir()
    log = tmp_path / "calls.log"
    script = make_script(
        "gxx-wrapper",
        f"""
        if [ "$1" = "--version" ]; then exec {GXX} --version; fi
        echo compile >> {log}
        if [ -e {control}/fail ]; then echo "wrapper: forced failure" >&2; exit 1; fi
        if [ -e {control}/sleep ]; then sleep 0.5; fi
        if [ -e {control}/wait ]; then
            touch {control}/started
            while [ ! -e {control}/continue ]; do sleep 0.01; done
        fi
        if [ -e {control}/rmcwd ]; then rm -f {control}/rmcwd; rm -rf "$(pwd -P)"; fi
        if [ -e {control}/rmcwd_always ]; then rm -rf "$(pwd -P)"; fi
        if [ -e {control}/hang ]; then
            for last; do :; done
            head -c 100 /bin/sh > "$last"
            touch {control}/started
            sleep 60
        fi
        exec {GXX} "$@"
        """,
    )
    monkeypatch.setenv("DEEPJIT_CXX", str(script))

    class Wrapper:
        path = script
        controls = control

        @staticmethod
        def calls() -> int:
            return len(log.read_text().splitlines()) if log.exists() else 0

        @staticmethod
        def set(mode: str, on: bool = True) -> None:
            flag = control / mode
            flag.touch() if on else flag.unlink(missing_ok=True)

    return Wrapper
