"""Fabric presets and the published dispatch/combine figures they are checked against.

Every figure names its source; a vendor figure that no third party has reproduced is marked a
claim, and a value no source gives (most hop latencies) is marked assumed. Bandwidths are per
rank and per direction, in bytes/s; 1 GB/s = 1e9 B/s, and 400 Gb/s = 50 GB/s.
"""

from __future__ import annotations

import attrs

from .fabric import GB, US, Fabric, Tier
from .routing import RoutingSpec
from .shape import BUFFER_EXCHANGE, DEEPSEEK_V3, ROWS_ONLY, Exchange, MoEShape

DEEPEP_LEGACY = ("DeepEP docs/legacy.md (github.com/deepseek-ai/DeepEP, commit dd758ca): normal kernels on H800, "
                 "'~160 GB/s NVLink maximum bandwidth', each GPU with a 'CX7 InfiniBand 400 Gb/s RDMA network card "
                 "(~50 GB/s maximum bandwidth)'")
UBL128_DESIGN = ("hengliao1972/pypto_top_level_documents UBL128_serving.md (GitHub): UBL128 = 8 PC16 servers, 128 "
                 "Ascend 950; a single-layer scale-up switch gives each NPU 3.2 Tbps, any-to-any; each NPU also has "
                 "one 400 Gbps UBG port into a two-layer non-blocking Clos scale-out network")
HUAWEI_SUPERPOD_FLEX = ("Huawei Computing announcement of the DeepSeek x Ascend 950 128-card SuperPoD (SuperPoD Flex / "
                        "UBL128: '128 cards, 3.2 Tbps single-layer switched scale-up; 256K cards, two-layer switched "
                        "scale-out'), as relayed by the Chinese press — a vendor claim, second-hand here")
CLOUDMATRIX_LATENCY = ("Huawei CloudMatrix384 (Zuo et al., arXiv 2506.12708, and press summaries): UB links NPUs across "
                       "nodes with under 1 us latency — a vendor figure for the previous generation (Ascend 910C)")
ASSUMED_LATENCY = "assumed (no published per-hop figure found); latency only matters for small messages"

NVLINK8_RDMA = Fabric(
    "nvlink8-rdma",
    (Tier("NVLink", 8, 160 * GB, 1 * US, hops=1),
     Tier("RDMA", None, 50 * GB, 1 * US, hops=3)),
    description="H800 nodes of 8 GPUs on NVLink (NVSwitch), one 400 Gb/s CX7 InfiniBand NIC per GPU",
    sources=(f"bandwidths: {DEEPEP_LEGACY}",
             "NVLink spec: H800 SXM has 400 GB/s of NVLink bidirectional (200 GB/s per direction); DeepEP's ~160 GB/s "
             "is the achievable figure used here",
             f"latencies (1 us per hop; 3 hops leaf-spine-leaf for RDMA): {ASSUMED_LATENCY}"),
)

UBL128 = Fabric(
    "ubl128",
    (Tier("UB scale-up", 128, 400 * GB, 1 * US, hops=1),),
    description="UBL128 / SuperPoD Flex: 128 Ascend 950 on one single-layer 3.2 Tbps (400 GB/s) UB switch tier",
    sources=(f"bandwidth and domain: {UBL128_DESIGN}", HUAWEI_SUPERPOD_FLEX,
             f"latency (1 us through the single switch layer): {CLOUDMATRIX_LATENCY}"),
)

UB_POD_256K = Fabric(
    "ub-pod-256k",
    (Tier("UB scale-up", 128, 400 * GB, 1 * US, hops=1),
     Tier("UBG scale-out", 256 * 1024, 50 * GB, 1 * US, hops=3)),
    description="two tiers: UBL128 domains (3.2 Tbps scale-up) joined by a 400 Gb/s-per-NPU two-layer Clos, "
                "up to 256K cards",
    sources=(f"tiers: {UBL128_DESIGN}", f"256K cards on two tiers: {HUAWEI_SUPERPOD_FLEX}",
             f"scale-up latency: {CLOUDMATRIX_LATENCY}",
             f"scale-out latency (1 us per hop, leaf-spine-leaf): {ASSUMED_LATENCY}"),
)

PRESETS: dict[str, Fabric] = {f.name: f for f in (NVLINK8_RDMA, UBL128, UB_POD_256K)}

#: this project's CI-class machine as a fabric: Gloo between local processes, every byte copied by
#: 2 shared CPU cores; calibrated by benchmarks/ep_cost_validate.py on 2026-12-01 (load average 9)
#: from the best of 21 rounds on 2 ranks — it moves with the machine's load (see docs/ep-cost-model.md)
GLOO_LOOPBACK_2CORE = Fabric(
    "gloo-2core",
    (Tier("Gloo loopback", None, 1.628 * GB, 0.0, hops=0, aggregate_bandwidth=3.256 * GB),),
    message_overhead=63.2 * US, local_bandwidth=3.29 * GB,
    description="Gloo all-to-all between local processes sharing 2 CPU cores (measured on this project's machine)",
    sources=("benchmarks/ep_cost_validate.py, 2026-12-01: 16 MB all-to-all on 2 ranks, best 10.37 ms (median 20.6); "
             "8 B all-to-all best 63.2 us (median 112.6); 64 MB copy best 3.29 GB/s; all ranks together = 2 cores x "
             "the 2-rank bandwidth",),
)
MEASURED: dict[str, Fabric] = {GLOO_LOOPBACK_2CORE.name: GLOO_LOOPBACK_2CORE}

DEEPEP_ASCEND = ("DeepEP-Ascend README (github.com/deepseek-ai/DeepEP-Ascend), as quoted by a third-party digest: "
                 "Ascend 950DT, CANN 9.2.0, PoC firmware, 'netlayer 1, the supernode's external Clos network', "
                 "16,384 tokens/rank capacity, top-6 of 256 experts; dispatch / combine GB/s: EP8 373-375 / 345-347, "
                 "EP16 348-352 / 338-341, EP32 335-340 / 320-324, EP64 323-327 / 294-298, EP128 313-320 / 272-278 "
                 "(the upper ends are used)")
DEEPEP_ASCEND_NOTE = ("the README itself could not be read here: hidden 7168, 4096 tokens and uniform top-6 routing are "
                      "assumed for the comparison")


@attrs.frozen
class PublishedFigure:
    """A dispatch/combine bandwidth someone published, in DeepEP's accounting (recv_x bytes, FP8 as
    bf16 x (1 + 4/128)/2, over the call's time). status: "measured" (a benchmark table with its
    setup) or "claim" (a vendor figure this project could not check); exchange: what the model
    compares it with (the Buffer's exchange, or the rows alone for kernels without a count exchange)."""

    name: str
    fabric: str
    num_ranks: int
    shape: MoEShape
    routing: RoutingSpec
    dispatch_gbps: float
    combine_gbps: float
    status: str
    source: str
    note: str = ""
    exchange: Exchange = BUFFER_EXCHANGE


PUBLISHED = (
    PublishedFigure(
        "DeepEP intranode, H800", "nvlink8-rdma", 8, DEEPSEEK_V3, RoutingSpec(seed=0), 153.0, 158.0, "measured",
        DEEPEP_LEGACY + "; tests/legacy/test_intranode.py: 4096 tokens, hidden 7168, random top-8 of 256 "
        "experts (no group limit), FP8 dispatch, bf16 combine, GB/s = recv_x bytes / time",
    ),
    PublishedFigure(
        "DeepEP low-latency EP256, H800", "nvlink8-rdma", 256, attrs.evolve(DEEPSEEK_V3, tokens_per_rank=128),
        RoutingSpec(seed=0), 39.0, 40.0, "measured",
        DEEPEP_LEGACY + "; low-latency kernels, 'pure RDMA', 128 tokens per batch, hidden 7168, top-8, FP8 dispatch, "
        "bf16 combine: EP256 dispatch 194 us / 39 GB/s, combine 360 us / 40 GB/s",
        note="low-latency mode sends one row per (token, expert); with 256 experts on 256 ranks that is one row per "
             "(token, rank), as here. It has no count exchange, so the model's rows-only exchange is compared",
        exchange=ROWS_ONLY,
    ),
    PublishedFigure(
        "DeepEP-Ascend EP8, Ascend 950DT", "ubl128", 8, attrs.evolve(DEEPSEEK_V3, num_topk=6), RoutingSpec(seed=0),
        375.0, 347.0, "claim", DEEPEP_ASCEND,
        note=DEEPEP_ASCEND_NOTE,
    ),
    PublishedFigure(
        "DeepEP-Ascend EP128, Ascend 950DT", "ubl128", 128, attrs.evolve(DEEPSEEK_V3, num_topk=6), RoutingSpec(seed=0),
        320.0, 278.0, "claim", DEEPEP_ASCEND,
        note=DEEPEP_ASCEND_NOTE,
    ),
)
