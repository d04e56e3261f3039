"""A separate builder process for the concurrency tests (run as a script, not collected).

usage: python jit_worker.py BARRIER_DIR INDEX OFFSET
Announces itself with BARRIER_DIR/ready.INDEX, waits for BARRIER_DIR/go, builds one tiny ctypes
library and prints {"origin": ..., "path": ..., "digest": ...} as JSON.
"""

import json
import sys
import time
from pathlib import Path

import deepjit

SOURCE = '#include <vector>\nextern "C" int add(int a, int b) { std::vector<int> v{a, b}; return v[0] + v[1] + OFFSET; }\n'
BARRIER_TIMEOUT_S = 120


def main() -> int:
    barrier, index, offset = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    jit = deepjit.JitContext()
    (barrier / f"ready.{index}").touch()
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while not (barrier / "go").exists():
        if time.monotonic() > deadline:
            print("barrier timed out", file=sys.stderr)
            return 3
        time.sleep(0.001)
    artifact = jit.build("race", SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": offset})
    lib = jit.compile("race", SOURCE, toolchain="host", kind="ctypes", defines={"OFFSET": offset})
    print(json.dumps({"origin": artifact.origin, "path": str(artifact.path), "digest": artifact.digest,
                      "sum": lib.add(2, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
