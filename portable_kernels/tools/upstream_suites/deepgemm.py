"""DeepGEMM's tests/ (script style: each file's top-level test_* functions are called).

Rewrites: deep_gemm imports to portable_kernels.deep_gemm, 'cuda' to 'cpu', and shape lists cut
to sizes a 2-core CPU runs in minutes. Each shape rule keeps the list's structure (how many
entries, which are unaligned: 4097 -> 257, 7296 = 57·128 -> 640 = 5·128, 2112 = 16.5·128 -> 320 =
2.5·128) so every code path the upstream list reaches is still reached.
"""

from __future__ import annotations

from .common import DEVICE_RULES, HARDWARE
from .engine import FileRule, Rule, Suite

IMPORT_RULES = (
    Rule(r"^(\s*)import deep_gemm\s*$", r"\1import portable_kernels.deep_gemm as deep_gemm", "the drop-in"),
    Rule(r"^(\s*)from deep_gemm([. ])", r"\1from portable_kernels.deep_gemm\2", "the drop-in"),
)

_SHAPES = "shape cut for a 2-core CPU"

SHAPE_RULES = (
    # generators.py: the grids every GEMM test enumerates
    Rule(r"fp32_output_nk = \[\(256, 7168\), \(129280, 7168\)\]",
         "fp32_output_nk = [(256, 512), (1152, 512)]", _SHAPES, ("generators.py",)),
    Rule(r"bf16_output_nk = \[\(2112, 7168\), \(576, 7168\), \(24576, 1536\), \(32768, 512\), "
         r"\(7168, 16384\), \(4096, 7168\), \(7168, 2048\)\]",
         "bf16_output_nk = [(320, 512), (576, 256), (384, 384), (512, 512), (256, 1024), (256, 512), (512, 256)]",
         _SHAPES, ("generators.py",)),
    Rule(r"m_fwd_list, m_bwd_list = \[1, 128, 4096\], \[4096, \]",
         "m_fwd_list, m_bwd_list = [1, 128, 256], [256, ]", _SHAPES, ("generators.py",)),
    Rule(r"m_group_list = \[\(4, 8192\), \(8, 4096\)\]", "m_group_list = [(4, 256), (8, 128)]",
         _SHAPES, ("generators.py",)),
    Rule(r"n_k_list = \[\(6144, 7168\), \(7168, 3072\), \(4096, 4096\), \(4096, 2048\)\]",
         "n_k_list = [(384, 512), (512, 384), (256, 256), (256, 128)]", _SHAPES, ("generators.py",)),
    Rule(r"max_m = 4096\n", "max_m = 256\n", _SHAPES, ("generators.py",)),
    Rule(r"m_group_list = \[\(32, 192\), \(6, 1024\), \(32, 20\), \(6, 20\)\]",
         "m_group_list = [(8, 192), (6, 128), (8, 20), (6, 20)]", _SHAPES, ("generators.py",)),
    Rule(r"\(\( 4, 4096, 7168, 8192\), \( 4, 7168, 2048, 8192\),(.*\n.*?)\( 8, 4096, 7168, 4096\), "
         r"\( 8, 7168, 2048, 4096\),(.*\n.*?)\(16, 4096, 7168, 2048\), \(16, 7168, 2048, 2048\)\)",
         r"(( 4, 256, 384, 512), ( 4, 384, 256, 512),\1( 8, 256, 384, 256), ( 8, 384, 256, 256),\2"
         r"(16, 256, 384, 128), (16, 384, 256, 128))", _SHAPES, ("generators.py",)),
    Rule(r"for mn in \(4096, 4097, 8192\):", "for mn in (256, 257, 512):", _SHAPES, ("generators.py",)),
    Rule(r"for k in \(128, 7168, 7296\):", "for k in (128, 512, 640):", _SHAPES, ("generators.py",)),
    Rule(r"for mn in \(4096, 7168\):", "for mn in (256, 384):", _SHAPES, ("generators.py",)),
    Rule(r"for num_groups, avg_k in \(\(16, 2048\), \(8, 4096\), \(72, 384\), \(128, 256\)\):",
         "for num_groups, avg_k in ((16, 256), (8, 512), (72, 128), (128, 128)):", _SHAPES, ("generators.py",)),
    Rule(r"for mn in \(64, 4096, 16384\):", "for mn in (64, 256, 512):", _SHAPES, ("generators.py",)),
    Rule(r"for k in \(128, 1024, 4096, 9984, 16384\):", "for k in (128, 1024, 1152):", _SHAPES,
         ("generators.py",)),
    # test_attention.py
    Rule(r"for m in \(128, 4096\):\n(\s*)for n, k in \[\(32768, 512\), \(8192, 512\)\]:",
         r"for m in (128, 256):\n\1for n, k in [(1024, 512), (512, 512)]:", _SHAPES, ("test_attention.py",)),
    Rule(r"for seq_len in \(2048, 8192\):", "for seq_len in (64, 128):", _SHAPES, ("test_attention.py",)),
    Rule(r"for seq_len_kv in \(8192, 65536\):", "for seq_len_kv in (256, 512):", _SHAPES, ("test_attention.py",)),
    Rule(r"for batch_size in \(256, 4096\):", "for batch_size in (4, 8):", _SHAPES, ("test_attention.py",)),
    Rule(r"for avg_kv in \(8192, 65536\):", "for avg_kv in (128, 300):", _SHAPES, ("test_attention.py",)),
    # test_einsum.py
    Rule(r"for s in \(129, 4096, 8192\):", "for s in (129, 256):", _SHAPES, ("test_einsum.py",)),
    Rule(r"\[\(128, 512, 128\), \(8, 4096, 1024\)\]", "[(16, 512, 128), (8, 512, 256)]", _SHAPES,
         ("test_einsum.py",)),
    Rule(r"\[\(8, 4096, 1024\)\]", "[(8, 512, 256)]", _SHAPES, ("test_einsum.py",)),
    Rule(r"for b in \(4, 32, 128, 4096, 8192\):", "for b in (4, 32, 128):", _SHAPES, ("test_einsum.py",)),
    Rule(r"for b in \(4096, 8192\):", "for b in (128, 256):", _SHAPES, ("test_einsum.py",)),
    # test_hyperconnection.py
    Rule(r"for m in \(13, 137, 4096, 8192\):", "for m in (13, 137, 256):", _SHAPES, ("test_hyperconnection.py",)),
    Rule(r"\[\(24, 28672\), \(24, 7680\), \(24, 7168\)\]", "[(24, 3584), (24, 1280), (24, 1024)]", _SHAPES,
         ("test_hyperconnection.py",)),
)

FILES = ("test_layout.py", "test_bf16.py", "test_fp8_fp4.py", "test_attention.py", "test_einsum.py",
         "test_hyperconnection.py", "test_legacy.py")

SUITE = Suite(
    name="DeepGEMM",
    copy=tuple((f"tests/{f}", f"tests/{f}") for f in ("generators.py", *FILES)),
    files=tuple(f"tests/{f}" for f in FILES),
    kind="script",
    rules=IMPORT_RULES + DEVICE_RULES + SHAPE_RULES,
    hardware=HARDWARE,
    skipped_files=(
        FileRule("tests/test_mega_moe.py", "hardware",
                 "several GPUs in a process group, NVSHMEM, DeepEP and TileLang baselines"),
        FileRule("tests/test_sanitizer.py", "hardware", "compute-sanitizer runs CUDA binaries"),
        FileRule("tests/test_lazy_init.py", "hardware",
                 "torch.cuda.set_device in 8 spawned processes (one GPU each); no test_* function"),
    ),
    quick_env=(("DG_MQA_NUM_CASES", "6"),),
)
