"""DeepEP's legacy tests (program style: each file's `__main__` spawns its ranks) through
portable_kernels.deep_ep, over Gloo on local processes.

Each file is run as upstream runs it, `python tests/legacy/FILE --num-processes N ...`, with the
sizes given on its own command line cut for a 2-core CPU (tokens, hidden, experts; every size
upstream's argparse accepts) and, for test_internode.py, two simulated nodes of 8 ranks (WORLD_SIZE
= 2, RANK = node, as a multi-node launcher sets them; the test asserts 8 local ranks). Rewrites:
deep_ep imports to the drop-in, 'cuda' to 'cpu', and the chunk-size tuning sweeps (each config
timed 100 times, nothing checked) cut to their first and default configs. A run passes when every
process exits 0.
"""

from __future__ import annotations

from .common import DEVICE_RULES, HARDWARE
from .engine import FileRule, Program, Rule, Suite

IMPORT_RULES = (
    Rule(r"^(\s*)import deep_ep\s*$", r"\1import portable_kernels.deep_ep as deep_ep", "the drop-in"),
    Rule(r"^(\s*)from deep_ep([. ])", r"\1from portable_kernels.deep_ep\2", "the drop-in"),
)

_TUNING = "tuning sweep (timing only, after every check) cut to its first and default configs for a CPU"

TUNING_RULES = (
    Rule(r"for nvl_chunk_size in tuple\(range\(4, 33, 2\)\) \+ \(0, \):", "for nvl_chunk_size in (4, 0):", _TUNING,
         ("test_intranode.py",)),
    Rule(r"for nvl_chunk_size in tuple\(range\(1, 17, 1\)\) \+ \(0, \):", "for nvl_chunk_size in (1, 0):", _TUNING,
         ("test_intranode.py",)),
    Rule(r"torch\.randn\(\(8192, 8192\), dtype=torch\.float\)", "torch.randn((256, 256), dtype=torch.float)",
         "the GEMM the receive hook overlaps in the timing phase (1.1 TFLOP per call; nothing checked), cut for a CPU",
         ("test_low_latency.py",)),
    Rule(r"for nvl_chunk_size in range\(4, 45, 4\):", "for nvl_chunk_size in (4, ):", _TUNING, ("test_internode.py",)),
    Rule(r"for rdma_chunk_size in range\(4, 33, 4\):", "for rdma_chunk_size in (4, ):", _TUNING, ("test_internode.py",)),
    Rule(r"for nvl_chunk_size in range\(1, 8, 1\):", "for nvl_chunk_size in (1, ):", _TUNING, ("test_internode.py",)),
    Rule(r"for rdma_chunk_size in range\(12 if num_nodes == 2 else 8, 33, 4\):",
         "for rdma_chunk_size in (12 if num_nodes == 2 else 8, ):", _TUNING, ("test_internode.py",)),
)

_LEGACY = "tests/legacy"
#: the sizes on each file's command line: tokens, hidden, top-k; test_low_latency's UE8M0 checks
#: regroup the packed scales as [-1, hidden / 128] words, which needs hidden to be a multiple of 512
#: (DeepEP's low-latency kernels take 2048 and up)
_SMALL = ("--num-tokens", "128", "--hidden", "256", "--num-topk", "4")
_SMALL_LL = ("--num-tokens", "64", "--hidden", "2048", "--num-topk", "4")


def _runs(file: str, ranks: tuple[int, ...], sizes: tuple[str, ...], experts: int) -> tuple[Program, ...]:
    return tuple(Program(f"{_LEGACY}/{file}", ("--num-processes", str(r), *sizes, "--num-experts", str(experts)),
                         f"{r}-ranks")
                 for r in ranks)


PROGRAMS = (
    *_runs("test_intranode.py", (2, 4, 8), _SMALL, 32),
    *_runs("test_low_latency.py", (2, 4, 8), _SMALL_LL, 32),
    Program(f"{_LEGACY}/test_internode.py", ("--num-processes", "8", *_SMALL, "--num-experts", "32"),
            "2x8-ranks", nodes=2),
)

SUITE = Suite(
    name="DeepEP",
    copy=((_LEGACY, _LEGACY),),
    files=tuple(dict.fromkeys(p.file for p in PROGRAMS)),
    kind="program",
    rules=IMPORT_RULES + DEVICE_RULES + TUNING_RULES,
    hardware=HARDWARE,
    programs=PROGRAMS,
    skipped_files=(
        FileRule("tests/elastic", "hardware", "DeepEP 2.x ElasticBuffer: NCCL device API (not provided, docs/porting.md)"),
    ),
)
