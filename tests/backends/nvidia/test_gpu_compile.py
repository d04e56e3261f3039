"""Every nvidia Triton kernel compiles to a cubin for sm_90a and sm_100a (no GPU needed).

The interpreter runs Python semantics and accepts code the GPU compiler rejects; this compiles
each kernel ahead of time in fresh processes without TRITON_INTERPRET (gpu_compile_all.py), one
config per kernel (`--all-configs` by hand for all of them). Both architectures compile at once,
in two processes (CI has two cores).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent
ARCHS = ("sm90", "sm100")


@pytest.fixture(scope="module")
def compiles():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    procs = {arch: subprocess.Popen([sys.executable, str(HERE / "gpu_compile_all.py"), arch], cwd=HERE, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for arch in ARCHS}
    results = {}
    for arch, proc in procs.items():
        out, err = proc.communicate(timeout=900)
        results[arch] = (proc.returncode, out, err)
    return results


@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles_for_the_gpu(compiles, arch):
    code, out, err = compiles[arch]
    assert code == 0, out[-4000:] + err[-4000:]
    assert out.splitlines()[-1].startswith("COMPILED")
