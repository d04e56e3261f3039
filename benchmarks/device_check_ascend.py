"""Device check of the ascend backend on one Atlas A2 / A3 or Ascend 950 NPU: one command that checks,
times and reports everything, printing a short summary last and writing a report to attach to an issue.
Nothing of the ascend backend has run on an NPU before this script is run on one (docs/ascend.md,
*For an NPU owner*).

Run on an NPU machine (repository root; CANN and torch_npu installed, then `pip install -e .`):
    python benchmarks/device_check_ascend.py              # the chip is detected; full conformance
    python benchmarks/device_check_ascend.py --quick      # quick conformance cases (saves minutes)
    python benchmarks/device_check_ascend.py --dry-run [--soc 950|910b|910c]   # CPU + stand-in (CI)
Sections, in order (each prints its wall time):
1. environment: torch, torch_npu and CANN versions, the chip (soc version, device name), the backend
   as `doctor` sees it;
2. conformance of every op on npu tensors, scales "ue8m0" and "fp32", the providers column naming the
   provider that ran each case (torch_npu... or layout-reference);
3. byte identity: every Format of the backend (and the three KV-cache Formats, and `nd_to_nz`) encoded from
   npu tensors equals the CPU encoding byte for byte;
4. MC2 row order: `row_order_self_test` at 2 ranks over HCCL (needs 2 NPUs and an A2/A3), the one
   undocumented assumption of the MC2 engine;
5. timings: each provider through the public op against the torch_npu code a user would write
   instead (per-call dequantize + matmul, a matmul per group, torch.topk, SDPA on the gathered cache,
   the cast in torch ops), median of rounds, with met / missed per target;
6. summary; the report goes to docs/device-runs/<date>-ascend-<chip>.log (or --report PATH).
The dry run does the same on CPU tensors against the test stand-in of torch_npu (tests/backends/
ascend/ascend_stub): it proves the script's plumbing, and every figure it prints is labelled
"stand-in, not timed on an NPU". Exit status 1 when a check failed (a missed target is reported only).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

import portable_kernels as pk

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = "stand-in, not timed on an NPU"
BUDGET_SECONDS = 450  # timings stop early (with a note) past 7.5 minutes
SECTIONS = ("environment", "conformance", "byte identity", "mc2 row order", "timings", "summary")
#: the conformance ops of a dry run (the full list takes minutes on a 2-core CI machine)
DRY_RUN_OPS = ("fp8_gemm_nt", "bf16_gemm_nt", "m_grouped_bf16_gemm_nt_contiguous", "per_token_cast_to_fp8", "topk",
               "flash_mla_with_kvcache")
LOG_LINES: list[str] = []
TARGETS: list[tuple[str, str, bool | None]] = []  # (target, measured, met)
START = time.perf_counter()


def say(line: str = "") -> None:
    print(line, flush=True)
    LOG_LINES.append(line)


def section(name: str) -> None:
    say(f"\n== {name} ({time.perf_counter() - START:.0f} s)")


def over_budget() -> bool:
    return time.perf_counter() - START > BUDGET_SECONDS


class Run:
    """What every section needs: the device, the chip, whether this is a dry run, the stand-in."""

    def __init__(self, dry: bool, soc: str | None) -> None:
        from portable_kernels.backends.ascend.vendor import runtime
        self.dry = dry
        self.runtime = runtime
        self.stand_in = None
        if dry:
            sys.path.insert(0, str(ROOT / "tests" / "backends" / "ascend"))
            self.stub = importlib.import_module("ascend_stub")
            self.chip = soc or "950"
            self.stand_in = self.stub.make_stand_in(self.chip)
            self.device = torch.device("cpu")
        else:
            self.chip = runtime.detected_chip()
            if soc is not None and soc != self.chip:
                say(f"note: --soc {soc} ignored on an NPU; the detected chip is {self.chip}")
            self.device = torch.device("npu")

    def npu_backend(self, **options: Any):
        """use_backend("ascend", soc=chip, ...) plus, in a dry run, the stand-in in place of torch_npu."""
        import contextlib
        stack = contextlib.ExitStack()
        if self.stand_in is not None:
            stack.enter_context(self.runtime.use_stand_in(self.stand_in))
        stack.enter_context(pk.use_backend("ascend", soc=self.chip, **options))
        return stack

    def sync(self) -> None:
        if self.device.type == "npu":
            torch.npu.synchronize()


# -- 1. environment ---------------------------------------------------------------------------------------

def environment(run: Run) -> list[str]:
    say(f"date {datetime.datetime.now().isoformat(timespec='seconds')}  host {platform.node()}  "
        f"python {platform.python_version()}  torch {torch.__version__}")
    if run.dry:
        say(f"DRY RUN: CPU tensors, torch_npu replaced by the test stand-in for soc {run.chip} ({STAND_IN})")
        return []
    npu = run.runtime.torch_npu()
    if npu is None or run.chip is None:
        say(f"ascend backend unavailable: {run.runtime.native_unavailable_reason() or 'chip not recognised'}")
        return ["no usable NPU (see the environment section)"]
    say(f"torch_npu {getattr(npu, '__version__', '?')}")
    for path in ("/usr/local/Ascend/ascend-toolkit/latest/version.cfg", "/usr/local/Ascend/cann/latest/version.cfg"):
        if os.path.exists(path):
            say(f"CANN {path}: " + " ".join(Path(path).read_text().split())[:200])
    say(f"chip {run.chip}: soc version {npu.npu.get_soc_version()}, device {npu.npu.get_device_name()}, "
        f"{torch.npu.device_count()} device(s)")
    info = pk.available_backends()["ascend"]
    say(f"ascend backend: available={info.available} reason={info.reason}")
    return []


# -- 2. conformance ----------------------------------------------------------------------------------------

def conformance(run: Run, quick: bool) -> list[str]:
    from portable_kernels.testing import run_conformance
    problems = []
    ops = DRY_RUN_OPS if run.dry else None
    for scales in ("ue8m0",) if run.dry else ("ue8m0", "fp32"):  # a dry run proves the loop once
        t0 = time.perf_counter()
        with run.npu_backend():  # the stand-in in a dry run; run_conformance sets the options itself
            report = run_conformance(backend="ascend", ops=ops, quick=quick, soc=run.chip, scales=scales)
        say(f"-- scales={scales} on {run.device.type} tensors" + (f" ({STAND_IN})" if run.dry else ""))
        for line in report.format_table().splitlines():
            say(line)
        cases = sum(r.cases for r in report.ops.values())
        passed = sum(r.passed for r in report.ops.values())
        native = sorted(op for op, r in report.ops.items() if any(n.startswith("torch_npu") for n in r.providers))
        say(f"conformance scales={scales}: {passed}/{cases} cases passed in {time.perf_counter() - t0:.1f} s; "
            f"{len(native)} ops ran a torch_npu provider")
        if not report.ok:
            problems.append(f"conformance failures (scales={scales})")
    return problems


# -- 3. byte identity ---------------------------------------------------------------------------------------

def byte_identity(run: Run) -> list[str]:
    from portable_kernels.layouts import ASCEND_BF16_KV, ASCEND_FP8_KV, FLASHMLA_FP8_KV, nd_to_nz, pack_fp8_kv_cache
    problems = []
    where = "cpu vs cpu (dry run: plumbing only)" if run.dry else f"{run.device} vs cpu"
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(96, 1000, generator=gen), torch.randn(260, 1000, generator=gen) / 30
    for soc, scales in (("950", "ue8m0"), ("950", "fp32"), ("910b", "ue8m0"), ("910b", "fp32")):
        ue8m0 = scales == "ue8m0"
        a = pk.per_token_cast_to_fp8(x, use_ue8m0=ue8m0)
        b = pk.per_block_cast_to_fp8(w, use_ue8m0=ue8m0)
        with pk.use_backend("ascend", soc=soc, scales=scales):
            on_cpu = pk.prepare_inputs(pk.fp8_gemm_nt, device="cpu", a=a, b=b)
            on_dev = pk.prepare_inputs(pk.fp8_gemm_nt, device=run.device, a=a, b=b)
        for arg in ("a", "b"):
            c, d = on_cpu[arg], on_dev[arg]
            same = all(torch.equal(_bytes(getattr(c, part)), _bytes(getattr(d, part).cpu()))
                       for part in ("data", "scale") if getattr(c, part) is not None)
            say(f"{d.format.name:40s} ({soc}, {scales}, {arg}): {where}: {'identical' if same else 'DIFFERENT'}")
            if not same:
                problems.append(f"{d.format.name} ({arg}) encoded on {run.device} differs from the CPU bytes")
    latent = torch.randn(4, 64, 1, 512, generator=gen)
    rope = torch.randn(4, 64, 1, 64, generator=gen).bfloat16()
    rows = pack_fp8_kv_cache(latent, rope)
    for fmt in (FLASHMLA_FP8_KV, ASCEND_FP8_KV, ASCEND_BF16_KV):
        same = torch.equal(fmt.encode(rows.to(run.device)).cpu(), fmt.encode(rows))
        say(f"{fmt.name:40s} (KV cache): {where}: {'identical' if same else 'DIFFERENT'}")
        if not same:
            problems.append(f"{fmt.name} encoded on {run.device} differs from the CPU bytes")
    weight = (torch.randn(256, 512, generator=gen) / 8).to(torch.float8_e4m3fn)
    same = torch.equal(_bytes(nd_to_nz(weight.to(run.device)).cpu()), _bytes(nd_to_nz(weight)))
    say(f"{'layouts.nd_to_nz (FRACTAL_NZ bytes)':40s}: {where}: {'identical' if same else 'DIFFERENT'} "
        f"(layouts.nz_storage's bytes; on A2/A3 prepare_inputs casts bf16 weights with npu_format_cast(x, 29), "
        f"whose result is checked by the conformance above, not byte by byte: .cpu() of an NZ tensor reads it as ND)")
    if not same:
        problems.append(f"nd_to_nz on {run.device} differs from the CPU bytes")
    return problems


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.dtype.itemsize == 1 else t.contiguous().view(-1).view(torch.uint8)


# -- 4. MC2 row order ------------------------------------------------------------------------------------------

def _stand_in_rank(rank: int, num_ranks: int, group, soc: str, stub_path: str) -> dict:
    sys.path.insert(0, stub_path)
    stub = importlib.import_module("ascend_stub")
    from portable_kernels.backends.ascend.vendor.mc2 import row_order_self_test
    report = row_order_self_test(group, stub.make_stand_in(soc), stub.register_group(group))
    return dict(ok=report.ok, detail=report.detail, observed=report.observed)


def _hccl_rank(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    import torch_npu  # noqa: F401 - registers the npu device and HCCL
    torch.npu.set_device(rank)
    dist.init_process_group("hccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    try:
        from portable_kernels.backends.ascend.vendor.mc2 import row_order_self_test
        report = row_order_self_test(dist.group.WORLD, device=f"npu:{rank}")
        value = dict(ok=report.ok, detail=report.detail, observed=report.observed)
    except BaseException as exc:
        value = dict(ok=False, detail=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
    torch.save(value, os.path.join(out_dir, f"rank{rank}.pt"))


def mc2_row_order(run: Run) -> list[str]:
    if run.chip not in ("910b", "910c"):
        say(f"skipped: the MC2 dispatch / combine v2 pages list Atlas A2 and A3 only (chip {run.chip})")
        return []
    if run.dry:
        from portable_kernels.testing.ep_distributed import run_ranks
        outcomes = run_ranks(2, _stand_in_rank, (run.chip, str(ROOT / "tests" / "backends" / "ascend")),
                             timeout_s=120)
        values = [o.value if o.ok else dict(ok=False, detail=o.describe()) for o in outcomes]
        where = f"2 Gloo ranks, {STAND_IN}"
    else:
        if torch.npu.device_count() < 2:
            say("skipped: needs 2 NPUs (HCCL) on this machine")
            return []
        import multiprocessing as mp
        from portable_kernels.testing.ep_distributed import free_port
        ctx = mp.get_context("spawn")
        with tempfile.TemporaryDirectory(prefix="pk-mc2-") as out_dir:
            port = free_port()
            procs = [ctx.Process(target=_hccl_rank, args=(r, port, out_dir)) for r in range(2)]
            for p in procs:
                p.start()
            for p in procs:
                p.join(300)
            values = []
            for r, p in enumerate(procs):
                path = os.path.join(out_dir, f"rank{r}.pt")
                if p.is_alive():
                    p.kill()
                values.append(torch.load(path, weights_only=False) if os.path.exists(path)
                              else dict(ok=False, detail=f"rank {r} wrote no result (exit {p.exitcode})"))
        where = "2 NPUs over HCCL"
    for rank, value in enumerate(values):
        say(f"rank {rank} ({where}): {'PASS' if value['ok'] else 'FAIL'} - {value['detail']}")
        if value.get("observed"):
            say(f"  rows per local expert as (source rank, token): {list(value['observed'])}")
        if value.get("trace"):
            say(value["trace"])
    return [] if all(v["ok"] for v in values) else ["MC2 row-order self-test failed (see the mc2 row order section)"]


# -- 5. timings ---------------------------------------------------------------------------------------------------

def timed(run: Run, fn: Callable[[], Any], rounds: int = 5, round_seconds: float = 0.05) -> float:
    """Median seconds per call (after one warm-up call), each round long enough to average launches."""
    fn()
    run.sync()
    t0 = time.perf_counter()
    fn()
    run.sync()
    iters = max(1, min(200, int(round_seconds / max(time.perf_counter() - t0, 1e-7))))
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        run.sync()
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def compare(run: Run, label: str, ours: Callable[[], Any], theirs: Callable[[], Any], peer: str,
            goal: float) -> None:
    """Time the public op (`ours`) against the user's torch_npu code (`theirs`); target ours >= goal x."""
    from portable_kernels.core.dispatch import trace_providers
    target = f"{label} >= {goal}x {peer}"
    if over_budget():
        say(f"{label}: budget reached, not timed")
        return
    try:
        with trace_providers() as ran:
            ours()
        provider = ran[-1][2] if ran else "?"
        if run.dry:
            theirs()  # both sides run once: the plumbing works
            say(f"{label:58s} provider {provider:24s} vs {peer}: {STAND_IN}")
            TARGETS.append((target, STAND_IN, None))
            return
        t_ours, t_theirs = timed(run, ours), timed(run, theirs)
    except Exception as exc:  # one case (e.g. a dtype this chip lacks) must not stop the others
        say(f"{label}: failed ({type(exc).__name__}: {exc})")
        TARGETS.append((target, f"failed: {type(exc).__name__}", None if run.dry else False))
        if run.dry:
            raise
        return
    ratio = t_theirs / t_ours
    say(f"{label:58s} provider {provider:24s} {t_ours * 1e6:9.1f} us | {peer} {t_theirs * 1e6:9.1f} us | "
        f"{ratio:5.2f}x")
    TARGETS.append((target, f"{ratio:.2f}x ({provider})", ratio >= goal))


def _dequantized(data: torch.Tensor, scale: torch.Tensor, granularity: tuple[int, int]) -> torch.Tensor:
    """What a user writes per call: fp8 data times its block scales, in bf16."""
    gm, gk = granularity
    s = scale.repeat_interleave(gm, 0)[: data.shape[0]] if gm > 1 else scale
    return (data.float() * s.repeat_interleave(gk, -1)[..., : data.shape[-1]]).bfloat16()


def timings(run: Run, shapes: dict[str, Any]) -> None:
    dev = run.device
    gen = torch.Generator().manual_seed(1)
    scales = "ue8m0"
    with run.npu_backend(scales=scales):
        for m, n, k in shapes["gemm"]:
            x = torch.randn(m, k, generator=gen).bfloat16().to(dev)
            w = (torch.randn(n, k, generator=gen) * k ** -0.5).bfloat16().to(dev)
            qa = pk.per_token_cast_to_fp8(x.cpu(), use_ue8m0=True)
            qb = pk.per_block_cast_to_fp8(w.cpu(), use_ue8m0=True)
            prepared = pk.prepare_inputs(pk.fp8_gemm_nt, device=dev, a=qa, b=qb)
            d = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
            a_raw = (qa.data.to(dev), qa.scale.to(dev), qa.granularity)
            b_raw = (qb.data.to(dev), qb.scale.to(dev), qb.granularity)
            compare(run, f"fp8_gemm_nt {m}x{n}x{k}", lambda: pk.fp8_gemm_nt(prepared["a"], prepared["b"], d),
                    lambda: torch.matmul(_dequantized(*a_raw), _dequantized(*b_raw).T),
                    "dequantize + matmul per call", 1.0)
        from portable_kernels.layouts import contiguous_m_indices
        for g, m_per, n, k in shapes["grouped"]:
            align = pk.get_m_alignment_for_contiguous_layout()
            m_indices = contiguous_m_indices(torch.full((g,), m_per), align).to(dev)
            rows = m_indices.numel()
            a = torch.randn(rows, k, generator=gen).bfloat16().to(dev)
            b = (torch.randn(g, n, k, generator=gen) * k ** -0.5).bfloat16().to(dev)
            d = torch.empty(rows, n, dtype=torch.bfloat16, device=dev)
            starts = [i * (-(-m_per // align) * align) for i in range(g)]

            def per_group(a=a, b=b, starts=starts, m_per=m_per):
                return [torch.matmul(a[s:s + m_per], b[i].T) for i, s in enumerate(starts)]
            compare(run, f"m_grouped_bf16 contiguous G={g} m={m_per} N={n} K={k}",
                    lambda: pk.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices), per_group,
                    "torch.matmul per group", 1.0)
        for b_, n_, k_ in shapes["topk"]:
            x = torch.randn(b_, n_, generator=gen).to(dev)
            compare(run, f"topk {b_}x{n_} k={k_}", lambda: pk.topk(x, k_), lambda: torch.topk(x, k_, dim=1),
                    "torch.topk", 0.8)
        for m, k in shapes["cast"]:
            x = torch.randn(m, k, generator=gen).bfloat16().to(dev)

            def torch_cast(x=x):
                blocks = x.float().view(m, -1, 128)
                amax = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-4)
                s = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
                return (blocks / s).to(torch.float8_e4m3fn), s
            compare(run, f"per_token_cast_to_fp8 {m}x{k} (1, 128), ue8m0",
                    lambda: pk.per_token_cast_to_fp8(x, 128, use_ue8m0=True), torch_cast, "the cast in torch ops",
                    1.0)
    for b_, s_k, h in shapes["mla"]:
        _time_mla(run, b_, s_k, h, gen)


def _time_mla(run: Run, b_: int, s_k: int, h: int, gen: torch.Generator) -> None:
    from portable_kernels.layouts import pack_fp8_kv_cache
    dev, block = run.device, 64
    per = -(-s_k // block)
    latent = torch.randn(b_ * per, block, 1, 512, generator=gen)
    rope = torch.randn(b_ * per, block, 1, 64, generator=gen).bfloat16()
    cache_rows = pack_fp8_kv_cache(latent, rope)
    table = torch.arange(b_ * per, dtype=torch.int32).view(b_, per).to(dev)
    seqlens = torch.full((b_,), s_k, dtype=torch.int32, device=dev)
    q = torch.randn(b_, 1, h, 576, generator=gen).bfloat16().to(dev)
    scale = 576 ** -0.5
    with run.npu_backend():
        cache = pk.prepare_inputs("flash_mla_with_kvcache", device=dev, k_cache=cache_rows)["k_cache"]
        meta, splits = pk.get_mla_metadata(seqlens, h, 1, is_fp8_kvcache=True)
        rows_dev = cache_rows.to(dev)

        def sdpa():
            # the user's code: gather and dequantize the sequence's rows, then SDPA (k = v's latent + rope)
            from portable_kernels.layouts import FLASHMLA_FP8_KV
            keys = FLASHMLA_FP8_KV.dequantize(rows_dev[table.long()].view(b_, per * block, 656))[:, :s_k]
            k = keys.unsqueeze(1).expand(b_, h, s_k, 576)
            return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, k[..., :512], scale=scale)
        compare(run, f"flash_mla_with_kvcache FP8 dense b={b_} s_k={s_k} h={h}",
                lambda: pk.flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta, splits, is_fp8_kvcache=True),
                sdpa, "SDPA on the gathered cache", 1.0)


# -- main ------------------------------------------------------------------------------------------------------

def write_report(run: Run, path: str | None) -> Path:
    if path is not None:
        out = Path(path)
    elif run.dry:
        out = Path(tempfile.gettempdir()) / f"device_check_ascend-dry-run-{run.chip}.log"
    else:
        out = ROOT / "docs" / "device-runs" / f"{datetime.date.today()}-ascend-{run.chip}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(LOG_LINES) + "\n")
    return out


DRY_SHAPES = {"gemm": [(4, 64, 256)], "grouped": [(2, 8, 32, 128)], "topk": [(2, 300, 8)], "cast": [(4, 256)],
              "mla": [(2, 100, 16)]}
NPU_SHAPES = {"gemm": [(64, 2112, 7168), (128, 7168, 2048), (4096, 4096, 7168)],
              "grouped": [(8, 512, 4096, 7168), (8, 1024, 7168, 2048)],
              "topk": [(64, 32768, 2048), (128, 131072, 2048)], "cast": [(4096, 7168)],
              "mla": [(64, 4096, 128), (64, 8192, 128)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="quick conformance cases")
    parser.add_argument("--dry-run", action="store_true", help="CPU tensors and the test stand-in (plumbing only)")
    parser.add_argument("--soc", choices=("950", "910b", "910c"), default=None, help="the chip a dry run stands in for")
    parser.add_argument("--skip-conformance", action="store_true")
    parser.add_argument("--report", default=None, help="where to write the report")
    args = parser.parse_args(argv)
    run = Run(args.dry_run, args.soc)
    problems: list[str] = []
    say(f"== ascend device check ({'DRY RUN: ' + STAND_IN if run.dry else 'NPU'}); chip {run.chip}")
    section("environment")
    problems += environment(run)
    if problems:
        say(f"checks: {problems}")
        print(f"report written to {write_report(run, args.report)}")
        return 1
    steps: list[tuple[str, Callable[[], list[str]]]] = [
        ("conformance", lambda: [] if args.skip_conformance else conformance(run, args.quick or run.dry)),
        ("byte identity", lambda: byte_identity(run)),
        ("mc2 row order", lambda: mc2_row_order(run)),
        ("timings", lambda: timings(run, DRY_SHAPES if run.dry else NPU_SHAPES) or []),
    ]
    for name, step in steps:
        section(name)
        try:
            problems += step()
        except Exception as exc:  # one section's failure must not hide the others'
            say(f"{name} failed: {type(exc).__name__}: {exc}")
            say(traceback.format_exc())
            problems.append(f"{name} raised {type(exc).__name__}")
    section("summary")
    for text, measured, met in TARGETS:
        verdict = "n/a" if met is None else ("met" if met else "missed")
        say(f"{verdict:7s} {text:90s} {measured}")
    say(f"checks: {'all passed' if not problems else problems}")
    say(f"wall time {time.perf_counter() - START:.0f} s")
    print(f"report written to {write_report(run, args.report)}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
