"""FlashMLA's tests/test_flash_mla_sparse_decoding.py through portable_kernels.flash_mla on the CPU.

    python -m portable_kernels.tools.upstream_suites.flashmla_sparse_decode --flashmla DIR [--per-d N]
        [--seed S] [--max-b B]

Upstream's own files run unchanged (its gen_testcase, test_flash_mla, ref.py, quant.py, kernelkit)
except one rewrite: lib.py's `cache_seqlens_cpu.cuda()` stays on the CPU. `import flash_mla` is the
drop-in. Only correctness cases run: the performance cases (num_runs > 0) time CUDA kernels with
kineto. The full grid is thousands of cases at b up to 321, too many for a 2-core CPU. A seeded
sample of N cases per d_qk runs instead (576: V3.2, 512: MODEL1; V3.2 gets N // 3). Its own
comparison (check_is_allclose against ref.py, FlashMLA's tolerances) decides pass or fail.
Not yet a suite of the upstream runner (`__main__`), which another change is editing.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEST = "test_flash_mla_sparse_decoding"
#: the one device rewrite upstream's lib.py needs on a CPU
CUDA_CALL = (r"cache_seqlens_cpu\.cuda\(\)", "cache_seqlens_cpu")


def _tree(checkout: Path, dest: Path) -> Path:
    tests = dest / "tests"
    if (checkout / "tests").is_dir():
        shutil.copytree(checkout / "tests", tests)
    else:  # a bare git directory (the fetched mirror)
        tests.mkdir(parents=True)
        archive = subprocess.run(["git", f"--git-dir={checkout}", "archive", "HEAD", "tests"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    lib = tests / "lib.py"
    text, hits = re.subn(CUDA_CALL[0], CUDA_CALL[1], lib.read_text())
    if hits != 1:
        raise SystemExit(f"{lib}: expected one {CUDA_CALL[0]!r}, found {hits}; upstream changed, update the rewrite")
    lib.write_text(text)
    return tests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flashmla", type=Path, required=True, help="a FlashMLA checkout or bare git directory")
    parser.add_argument("--per-d", type=int, default=6, help="sampled cases for d_qk = 512 (576 gets a third)")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--max-b", type=int, default=74, help="leave out cases of a larger batch (time)")
    args = parser.parse_args(argv)
    import torch

    from . import cuda_stubs
    import portable_kernels.flash_mla as flash_mla

    work = Path(tempfile.mkdtemp(prefix="flashmla_suite_"))
    sys.path.insert(0, str(_tree(args.flashmla, work)))
    cuda_stubs.install()
    sys.modules["flash_mla"] = flash_mla
    T = __import__(TEST)
    torch.set_default_dtype(torch.bfloat16)
    cases = [c for c in T.gen_testcase() if c.check_correctness and c.num_runs == 0 and c.b <= args.max_b]
    by_d: dict[int, list] = collections.defaultdict(list)
    for c in cases:
        by_d[c.d_qk].append(c)
    rng = random.Random(args.seed)
    for d, grid in sorted(by_d.items()):
        pick = rng.sample(grid, min(args.per_d if d == 512 else max(1, args.per_d // 3), len(grid)))
        counts: collections.Counter = collections.Counter()
        start = time.monotonic()
        for i, raw in enumerate(pick):
            p = raw.to_test_param()
            p.seed = args.seed * 100000 + i
            log = io.StringIO()
            try:
                with contextlib.redirect_stdout(log):
                    ok = T.test_flash_mla(p).is_correct
                counts["passed" if ok else "failed"] += 1
                if not ok:
                    print("FAILED", raw, log.getvalue()[-400:], flush=True)
            except Exception as e:  # noqa: BLE001 - a refused call is a result to report
                counts["error"] += 1
                print("ERROR", raw, f"{type(e).__name__}: {str(e)[:300]}", flush=True)
        print(f"{TEST}.py d_qk={d}: {len(grid)} correctness cases with b <= {args.max_b}, {len(pick)} sampled "
              f"(seed {args.seed}): {dict(counts)} in {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
