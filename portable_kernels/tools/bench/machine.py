"""What a benchmark ran on: the machine (CPU model, cores, load, OS, accelerators) and the versions.

Rule: every field is read, never assumed; what cannot be read here is None, not a guess.
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from ...core.native.openmp_wait import WAIT_VARIABLES, usable_cores


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else platform's answer)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _accelerators() -> list[str]:
    found = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = ".".join(map(str, torch.cuda.get_device_capability(i)))
            found.append(f"cuda:{i} {torch.cuda.get_device_name(i)} (capability {cap})")
    return found


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": usable_cores(),
        "load_average": load_average(),  # 1, 5 and 15 minutes, when the run started
        "os": platform.platform(),
        "hostname": platform.node(),
        "accelerators": _accelerators(),
        # OpenMP's waiting policy changes multi-thread times a lot on a crowded machine (see
        # portable_kernels.core.native.openmp_wait); libgomp reads these once, at import torch
        "openmp_wait": {name: os.environ.get(name) for name in WAIT_VARIABLES},
    }


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def versions() -> dict[str, Any]:
    try:
        pk_version = metadata.version("portable-kernels")
    except metadata.PackageNotFoundError:
        from portable_kernels import __version__ as pk_version
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "portable_kernels": pk_version,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),  # tracked files changed since that commit
    }
