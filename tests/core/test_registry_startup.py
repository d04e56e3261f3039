"""Registry start-up is race-free: threads making their first call together in a fresh process all
see the complete registry (plugins are loaded under the lock and published once complete)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

FIRST_CALLS = r"""
import json, threading, torch
import portable_kernels as pk

x = torch.randn(4, 256)
barrier = threading.Barrier(8)
errors = []

def first_call(i):
    barrier.wait()
    try:
        if i % 2:
            pk.topk(x, 4)
        else:
            with pk.use_backend("nvidia", arch="sm100"):
                pk.per_token_cast_to_fp8(x, use_ue8m0=True, prepare_for=pk.fp8_gemm_nt)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")

threads = [threading.Thread(target=first_call, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(errors))
"""


def _fresh_process(_: int) -> list[str]:
    result = subprocess.run([sys.executable, "-c", FIRST_CALLS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_eight_threads_first_calls_in_twenty_fresh_processes_never_fail():
    with ThreadPoolExecutor(max_workers=4) as pool:
        errors = [e for errs in pool.map(_fresh_process, range(20)) for e in errs]
    assert errors == []
