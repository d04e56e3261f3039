"""The doctor's OpenMP waiting note: shown for multi-thread runs with libgomp's default spinning,
with the load against the cores; silent on one thread or when a wait variable is set."""

from __future__ import annotations

import os
import subprocess
import sys

from portable_kernels.core.native.openmp_wait import openmp_wait_note


def test_note_names_the_variables_the_load_and_the_fix():
    note = openmp_wait_note(2, environ={}, load=5.2, cores=2)
    assert note is not None
    assert "GOMP_SPINCOUNT" in note and "OMP_WAIT_POLICY" in note and "load average 5.2 on 2 cores" in note
    assert "crowded" in note and "torch.set_num_threads(1)" in note
    assert "crowded" not in openmp_wait_note(2, environ={}, load=0.5, cores=2)


def test_no_note_on_one_thread_or_with_a_wait_variable_set():
    assert openmp_wait_note(1, environ={}, load=9.0, cores=2) is None
    assert openmp_wait_note(4, environ={"GOMP_SPINCOUNT": "10000"}, load=9.0, cores=2) is None
    assert openmp_wait_note(4, environ={"OMP_WAIT_POLICY": "passive"}, load=9.0, cores=2) is None


def test_doctor_prints_it_only_when_it_applies():
    code = "import sys; from portable_kernels.__main__ import main; sys.exit(main(['doctor']))"
    for env, shown in (({"OMP_NUM_THREADS": "2"}, True), ({"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "10000"}, False)):
        full = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")} | env
        out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert ("OpenMP threads spin" in out.stdout) is shown
