"""FlashMLA's tests/ (case-list files: cases.py) through portable_kernels.flash_mla.

Each file's own `main()` / `__main__` block lists its cases and calls one function per case; the
runner lets that code enumerate them and runs a sample (every group of features in turn) of those a
CPU reference finishes in seconds. Rewrites: flash_mla imports to the drop-in, 'cuda' / 'cuda:0' to
'cpu', the `__main__` blocks that build the case lists made callable, the CUDA-only pieces that
neither compute nor check anything (a 32-thread setting, triton's CUDA-event timer, the sm90-only
capability probe of the dense decoding file: the drop-in's dense decode runs on every backend), and
test_fmha_sm100's sequence lengths cut for a CPU. Per case `num_runs` / `test_performance` are set
to 0 / False: they only select CUDA-kernel profiling after the correctness check.
"""

from __future__ import annotations

import copy

from .cases import CaseDriver
from .common import DEVICE_RULES, HARDWARE
from .engine import Rule, Suite

IMPORT_RULES = (
    Rule(r"^(\s*)import flash_mla\s*$", r"\1import portable_kernels.flash_mla as flash_mla", "the drop-in"),
    Rule(r"^(\s*)from flash_mla([. ])", r"\1from portable_kernels.flash_mla\2", "the drop-in"),
)

_MAIN = "the case list is built in the __main__ block: made a function the runner calls"

FILE_RULES = (
    Rule(r"""torch\.device\((['"])cuda:0\1\)""", 'torch.device("cpu")', "tensors are made on the CPU"),
    Rule(r"^if __name__ == '__main__':$", "def _pk_main():", _MAIN, ("test_flash_mla_sparse_prefill.py",)),
    Rule(r'^if __name__ == "__main__":$', "def _pk_main():\n    global h, h_k  # sdpa() reads the loop's h, h_k",
         _MAIN, ("test_fmha_sm100.py",)),
    Rule(r"^(\s*)torch\.set_num_threads\(32\)$", r"\1pass  # thread count: left to the machine",
         "a 32-thread setting on a small CPU", ("test_flash_mla_sparse_decoding.py",)),
    Rule(r"^(\s*)cc_major, cc_minor = torch\.cuda\.get_device_capability\(\)$",
         r"\1cc_major, cc_minor = 9, 0  # the drop-in's dense decode runs on every backend",
         "the sm90-only probe of upstream's kernel", ("test_flash_mla_dense_decoding.py",)),
    Rule(r'^(\s*)timer\((forward|backward), "(fwd|bwd)"\)$', r"\1pass  # timing: triton.testing.do_bench needs CUDA",
         "timing, after every check", ("test_fmha_sm100.py",)),
    Rule(r"for \(mean_sq, mean_sk\) in \[\(4096, 4096\), \(8192, 8192\)\]:",
         "for (mean_sq, mean_sk) in [(128, 128), (256, 256)]:", "shape cut for a 2-core CPU", ("test_fmha_sm100.py",)),
    Rule(r"skip_correctness_check = mean_sq == 8192 and mean_sk == 8192 and h == 128",
         "skip_correctness_check = mean_sq == 256 and mean_sk == 256 and h == 128",
         "the same cut (the larger shape's correctness check is skipped upstream)", ("test_fmha_sm100.py",)),
)


def _no_profiling(args: tuple) -> tuple:
    p = copy.copy(args[0])
    for name, off in (("num_runs", 0), ("test_performance", False)):
        if hasattr(p, name):
            setattr(p, name, off)
    return (p, *args[1:])


def _decode_cost(args: tuple) -> float:
    p = args[0]
    d = p.decode
    topk = p.topk + (d.extra_topk or 0)
    return float(d.b) * p.s_q * topk * p.h_q * p.d_qk + float(d.b) * (p.s_kv + (d.extra_s_k or 0)) * p.d_qk


def _decode_label(args: tuple) -> str:
    p = args[0]
    d = p.decode
    extra = f"+{d.extra_topk}" if d.extra_topk else ""
    return f"b={d.b} h_q={p.h_q} s_q={p.s_q} s_k={p.s_kv} topk={p.topk}{extra} d_qk={p.d_qk} block={d.block_size}"


def _prefill_label(args: tuple) -> str:
    p = args[0]
    return (f"s_q={p.s_q} s_kv={p.s_kv} topk={p.topk} h_q={p.h_q} d_qk={p.d_qk} sink={int(p.have_attn_sink)} "
            f"topk_len={int(p.have_topk_length)} invalid={int(p.is_all_indices_invalid)}")


def _dense_label(args: tuple) -> str:
    t = args[0]
    return (f"b={t.b} s_q={t.s_q} s_k={t.s_k} h_q={t.h_q} h_kv={t.h_kv} varlen={int(t.is_varlen)} "
            f"causal={int(t.is_causal)} zero_len={int(t.have_zero_seqlen_k)}")


# test_flash_attention(b, mean_sq, mean_sk, varlen, h, h_k, d, dv, causal, window, has_bwd, check)
_FMHA = ("b", "mean_sq", "mean_sk", "varlen", "h", "h_k", "d", "dv", "causal", "window", "has_bwd", "check")


def _fmha_label(args: tuple) -> str:
    return " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in zip(_FMHA, args) if k != "window")


DRIVERS = {
    "test_flash_mla_sparse_decoding.py": CaseDriver(
        function="test_flash_mla", entry="main()", stub=lambda m: m.Result(True, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        passed=lambda r: bool(r.is_correct), cost=_decode_cost, prepare=_no_profiling, label=_decode_label,
        group=lambda a: (a[0].d_qk, a[0].decode.extra_topk is not None, a[0].have_topk_length, a[0].h_q)),
    "test_flash_mla_sparse_prefill.py": CaseDriver(
        function="run_test", entry="_pk_main()", stub=lambda m: True, passed=lambda r: r is True,
        cost=lambda a: float(a[0].s_q) * a[0].topk * a[0].h_q * a[0].d_qk + float(a[0].s_kv) * a[0].d_qk,
        prepare=_no_profiling, label=_prefill_label,
        group=lambda a: (a[0].d_qk, a[0].have_attn_sink, a[0].have_topk_length, a[0].is_all_indices_invalid)),
    "test_flash_mla_dense_decoding.py": CaseDriver(
        function="test_flash_mla", entry="main(torch.bfloat16)\nmain(torch.float16)", stub=lambda m: None,
        passed=lambda r: True, cost=lambda a: float(a[0].b) * a[0].s_q * a[0].h_q * a[0].s_k * a[0].d,
        prepare=_no_profiling, label=_dense_label,
        group=lambda a: (a[0].h_kv > 1, a[0].is_causal, a[0].have_zero_seqlen_k)),
    "test_fmha_sm100.py": CaseDriver(
        function="test_flash_attention", entry="_pk_main()", stub=lambda m: None, passed=lambda r: True,
        cost=lambda a: 2.0 * a[0] * a[1] * a[2] * a[4] * a[6], label=_fmha_label, captured=("h", "h_k"),
        group=lambda a: (a[10], a[8])),
}

FILES = tuple(f"tests/{f}" for f in DRIVERS)

SUITE = Suite(
    name="FlashMLA",
    copy=(("tests", "tests"),),
    files=FILES,
    kind="cases",
    rules=IMPORT_RULES + DEVICE_RULES + FILE_RULES,
    hardware=HARDWARE,
    drivers=__name__,
)
