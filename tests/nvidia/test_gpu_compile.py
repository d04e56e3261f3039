"""Every nvidia Triton kernel compiles to a cubin for sm_90a and sm_100a (no GPU needed).

The interpreter runs Python semantics and accepts code the GPU compiler rejects; this compiles
each kernel ahead of time in a fresh process without TRITON_INTERPRET (gpu_compile_all.py), one
config per kernel (`--all-configs` by hand for all of them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_every_kernel_compiles_for_the_gpu(arch):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, str(HERE / "gpu_compile_all.py"), arch], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "COMPILED" in proc.stdout.splitlines()[-1]
