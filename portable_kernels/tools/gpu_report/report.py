"""The gpu report: every specimen (specimens.py) compiled for one arch (aot.py), each compiled
kernel read back from its cubin (sass.py) into a KernelRow, and `gate`, which returns the rows'
violations of the rules below. Needs triton and compiled mode (no TRITON_INTERPRET); no GPU.

Rules (`gate`): no spill (stack frame or local memory) in a default config; every GEMM, MLA decode,
sparse MLA prefill, varlen attention and indexer kernel's dots on the arch's own tensor cores (wgmma on sm_90a, tcgen05 on sm_100a:
neither mma.sync nor no MMA at all); shared memory within what one block may use.
"""

from __future__ import annotations

import collections
from typing import Literal

import attrs

from .sass import TCGEN05, WGMMA, SassFacts

Rule = Literal["spill", "tensor_core", "shared"]

#: shared memory per SM on H100/H200 and B200 is 228 KiB; one block may use 227 KiB (opt-in above 48 KiB)
MAX_SHARED_BYTES_PER_BLOCK = 227 * 1024
EXPECTED_TENSOR_CORE = {"sm90": WGMMA, "sm100": TCGEN05}
#: kernels whose tl.dot must run on the arch's own tensor cores
DOT_KERNELS = frozenset({"fp8_gemm_nt_kernel", "bf16_gemm_nt_kernel", "fp8_fp4_gemm_nt_kernel",
                         "grouped_contiguous_kernel", "grouped_masked_kernel", "mla_decode_kernel",
                         "mla_sparse_prefill_kernel", "varlen_attention_kernel",
                         "mqa_logits_kernel", "paged_mqa_logits_kernel", "hc_prenorm_gemm_kernel",
                         "k_grouped_kernel"})
#: kernels bound by memory bandwidth, whose widest global load the report shows
MEMORY_BOUND_KERNELS = frozenset({"cast_fp8_kernel", "cast_fp8_channel_kernel", "cast_fp4_kernel", "swiglu_cast_kernel", "mla_decode_kernel",
                                  "mla_combine_kernel", "topk_kernel", "paged_mqa_logits_kernel", "moe_gate_kernel",
                                  "moe_expand_kernel", "moe_reduce_kernel"})


@attrs.frozen
class KernelRow:
    """One compiled kernel of one specimen: what its cubin and Triton's metadata say."""

    arch: str
    specimen: str
    #: index into the kernel's CONFIGS (0 is the default), None for kernels without autotune configs
    config: int | None
    kernel: str
    num_warps: int
    num_stages: int
    registers: int
    stack_bytes: int
    local_bytes: int
    shared_bytes: int
    tmem_bytes: int
    tensor_core: str
    #: tensor-core opcodes with counts, e.g. {"QGMMA.64x128x32.F32.E4M3.E4M3": 4}
    mma: dict[str, int]
    tma_loads: int
    widest_load: str
    widest_load_bits: int

    @property
    def default(self) -> bool:
        return self.config in (None, 0)

    @property
    def spill_bytes(self) -> int:
        return self.stack_bytes + self.local_bytes

    def mma_summary(self) -> str:
        """Counts per opcode and shape, e.g. "4 QGMMA.64x128x32" (accumulator / operand types left out)."""
        shapes: collections.Counter = collections.Counter()
        for opcode, count in self.mma.items():
            shapes[".".join(opcode.split(".")[:2])] += count
        return ", ".join(f"{count} {op}" for op, count in sorted(shapes.items())) or "-"


@attrs.frozen
class Violation:
    arch: str
    specimen: str
    #: the row's config (None: no autotune configs); not part of `key`, which names default-config breaches
    config: int | None
    kernel: str
    rule: Rule
    #: bytes for spill and shared; 0 for tensor_core (the family found is in `measured`)
    figure: int
    measured: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.specimen, self.kernel, self.arch, self.rule)


def gate(rows: list[KernelRow]) -> list[Violation]:
    """Every rule every row breaks (module docstring); spills count in default configs only."""
    found = []
    for row in rows:
        if row.default and row.spill_bytes:
            found.append(Violation(row.arch, row.specimen, row.config, row.kernel, "spill", row.spill_bytes,
                                   f"{row.stack_bytes} B stack frame, {row.local_bytes} B local"))
        expected = EXPECTED_TENSOR_CORE[row.arch]
        if row.kernel in DOT_KERNELS and row.tensor_core != expected:
            found.append(Violation(row.arch, row.specimen, row.config, row.kernel, "tensor_core", 0,
                                   f"{row.tensor_core} ({row.mma_summary()}), not {expected}"))
        if row.shared_bytes > MAX_SHARED_BYTES_PER_BLOCK:
            found.append(Violation(row.arch, row.specimen, row.config, row.kernel, "shared", row.shared_bytes,
                                   f"{row.shared_bytes} B > {MAX_SHARED_BYTES_PER_BLOCK} B per block"))
    return found


def _row(arch: str, specimen: str, config: int | None, kernel, facts: SassFacts) -> KernelRow:
    meta = kernel.metadata
    return KernelRow(arch, specimen, config, kernel.name, meta.num_warps, meta.num_stages, facts.registers,
                     facts.stack_bytes, facts.local_bytes, meta.shared, getattr(meta, "tmem_size", 0) or 0,
                     facts.tensor_core, facts.mma, facts.tma_loads, facts.widest_load, facts.widest_load_bits)


def run_report(arch: str, all_configs: bool = False) -> list[KernelRow]:
    """Compile every specimen for `arch` (Triton's cache makes a second run cheap) and read each cubin.
    Raises RuntimeError naming the specimen when a compile fails."""
    from .aot import ARCHS, compiling_for
    from .sass import read_cubin
    all_specimens = specimens_module().all_specimens
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {sorted(ARCHS)}, got {arch!r}")
    rows, facts_by_hash = [], {}
    for config, name, call in all_specimens(all_configs):
        record: list = []
        try:
            with compiling_for(arch, record):
                call()
        except Exception as exc:  # name the specimen, keep the compiler's message
            raise RuntimeError(f"{name} (config {config}) does not compile for {arch}: "
                               f"{type(exc).__name__}: {exc}") from exc
        for kernel in record:
            if kernel.hash not in facts_by_hash:
                facts_by_hash[kernel.hash] = read_cubin(kernel.asm["cubin"])
            rows.append(_row(arch, name, config, kernel, facts_by_hash[kernel.hash]))
    return rows


def format_rows(rows: list[KernelRow]) -> str:
    """A markdown table, one line per compiled kernel (the widest global load for memory-bound kernels only)."""
    lines = ["| specimen | cfg | kernel | warps/stages | regs | spill B | shared B | tensor core | TMA loads | widest LDG |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mma = r.tensor_core if r.tensor_core == "none" else f"{r.tensor_core}: {r.mma_summary()}"
        load = (r.widest_load or "-") if r.kernel in MEMORY_BOUND_KERNELS else ""
        lines.append(f"| {r.specimen} | {'-' if r.config is None else r.config} | {r.kernel.removesuffix('_kernel')} "
                     f"| {r.num_warps}/{r.num_stages} | {r.registers} | {r.spill_bytes} | {r.shared_bytes} | {mma} "
                     f"| {r.tma_loads or '-'} | {load} |")
    return "\n".join(lines)



def format_violations(violations: list[Violation]) -> str:
    if not violations:
        return "gate: no violations"
    lines = [f"gate: {len(violations)} violation(s)"]
    lines += [f"  {v.arch} {v.rule:11s} {v.specimen}{'' if v.config is None else f' (config {v.config})'} / {v.kernel}: "
              f"{v.measured}" for v in violations]
    return "\n".join(lines)


#: the module that holds the nvidia backend's compile specimens (loaded by name: no static backend import)
SPECIMENS_MODULE = "portable_kernels.backends.nvidia.gpu_specimens"


def specimens_module():
    """The nvidia backend's specimen module (imported on demand, as the registry loads backends)."""
    import importlib

    return importlib.import_module(SPECIMENS_MODULE)
