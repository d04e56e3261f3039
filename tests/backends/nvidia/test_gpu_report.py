"""The static gpu report (`python -m portable_kernels gpu-report`, default configs, sm_90a and sm_100a;
conftest's `gpu_reports` runs it once for test_gpu_compile too) and its gate.

Today's kernels break the gate: KNOWN_VIOLATIONS lists each breach as measured from the cubins
(open defects, docs/nvidia.md). The report must find exactly these: a new violation fails, and a
fix fails too until its line is removed here; a known spill may shrink but not grow.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from portable_kernels.tools.gpu_report import sass  # noqa: E402
from portable_kernels.tools.gpu_report.report import (MAX_SHARED_BYTES_PER_BLOCK, KernelRow,  # noqa: E402
                                                      Violation, gate)

ARCHS = ("sm90", "sm100")

#: (specimen, kernel, arch, rule, measured: spill bytes; 0 for tensor_core, whose found family is mma.sync)
KNOWN_VIOLATIONS = (
    ("cast_fp4 deep_gemm", "cast_fp4_kernel", "sm90", "spill", 8),
    ("cast_fp4 deep_gemm", "cast_fp4_kernel", "sm100", "spill", 8),
)


def _rows(gpu_reports, arch) -> list[KernelRow]:
    code, out, err, report = gpu_reports[arch]
    assert code == 0, out[-4000:] + err[-4000:]
    return [KernelRow(**row) for row in report["rows"]]


def _known(arch):
    return {(s, k, a, r): figure for s, k, a, r, figure in KNOWN_VIOLATIONS if a == arch}


@pytest.mark.parametrize("arch", ARCHS)
def test_gate_finds_exactly_the_known_violations(gpu_reports, arch):
    found = {v.key: v.measured for v in gate(_rows(gpu_reports, arch))}
    assert set(found) == set(_known(arch)), (
        f"new: {[(k, found[k]) for k in set(found) - set(_known(arch))]}; "
        f"fixed (remove from KNOWN_VIOLATIONS and docs/nvidia.md): {sorted(set(_known(arch)) - set(found))}")


@pytest.mark.parametrize("arch", ARCHS)
def test_known_spills_do_not_grow(gpu_reports, arch):
    found = {v.key: v.figure for v in gate(_rows(gpu_reports, arch)) if v.rule == "spill"}
    grown = {key: (found[key], figure) for key, figure in _known(arch).items() if key in found and found[key] > figure}
    assert not grown, f"(measured, recorded) spill bytes: {grown}"


@pytest.mark.parametrize("arch", ARCHS)
def test_report_json_carries_the_gate_and_a_roofline(gpu_reports, arch):
    report = gpu_reports[arch][3]
    assert [Violation(**v) for v in report["violations"]] == gate(_rows(gpu_reports, arch))
    assert {b["family"] for b in report["roofline"]} >= {"fp8_gemm", "mla_decode", "topk", "paged_mqa_logits"}


SASS_EXCERPT = """
 Function fp8_kernel:
  REG:168 STACK:24 SHARED:1024 LOCAL:8 CONSTANT[0]:656 TEXTURE:0 SURFACE:0 SAMPLER:0
        /*0100*/                   UTMALDG.2D [UR8], [UR4] ;                    /* 0x0000000804007db4 */
        /*0110*/              @!P0 LDG.E.128 R4, desc[UR6][R2.64] ;             /* 0x0000000602047981 */
        /*0120*/                   LDG.E.U16 R8, desc[UR6][R2.64+0x10] ;        /* 0x0000100602087981 */
        /*0130*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24 ;  /* 0x00e0000418187df3 */
        /*0140*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24 ;  /* 0x00e0000818187df3 */
        /*0150*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;       /* 0x000000100c08723c */
"""


def test_sass_parser_reads_resources_mma_tma_and_load_width():
    facts = sass.parse(SASS_EXCERPT)
    assert (facts.registers, facts.stack_bytes, facts.local_bytes, facts.tma_loads) == (168, 24, 8, 1)
    assert facts.mma == {"QGMMA.64x128x32.F32.E4M3.E4M3": 2, "HMMA.16816.F32.BF16": 1}
    assert facts.tensor_core == "mma.sync+wgmma"
    assert (facts.widest_load, facts.widest_load_bits) == ("LDG.E.128", 128)


@pytest.mark.parametrize("opcode, family", [("HGMMA.64x256x16.F32.BF16", "wgmma"), ("UTCQMMA", "tcgen05"),
                                            ("UTCHMMA.2CTA", "tcgen05"), ("HMMA.16816.F32.BF16", "mma.sync"),
                                            ("IADD3", None)])
def test_sass_opcodes_map_to_tensor_core_families(opcode, family):
    assert sass.mma_family(opcode) == family


def _row(**changes) -> KernelRow:
    base = dict(arch="sm90", specimen="s", config=0, kernel="fp8_gemm_nt_kernel", num_warps=8, num_stages=3,
                registers=128, stack_bytes=0, local_bytes=0, shared_bytes=1024, tmem_bytes=0, tensor_core="wgmma",
                mma={"QGMMA.64x128x32.F32.E4M3.E4M3": 4}, tma_loads=0, widest_load="", widest_load_bits=0)
    return KernelRow(**{**base, **changes})


@pytest.mark.parametrize("changes, rule", [
    (dict(stack_bytes=16), "spill"),
    (dict(tensor_core="mma.sync", mma={"HMMA.16816.F32.BF16": 8}), "tensor_core"),
    (dict(arch="sm100"), "tensor_core"),  # wgmma on sm100 is not tcgen05
    (dict(shared_bytes=MAX_SHARED_BYTES_PER_BLOCK + 1), "shared"),
])
def test_gate_names_the_rule_a_kernel_breaks(changes, rule):
    assert [v.rule for v in gate([_row(**changes)])] == [rule]


def test_gate_ignores_spills_outside_the_default_config():
    assert gate([_row(config=2, stack_bytes=64)]) == []
