"""EP cost model: the bytes one MoE layer's dispatch + combine moves per rank and per fabric tier,
and the lower-bound time of that exchange, for a model shape, a fabric and an EP degree.

    from portable_kernels.tools.ep_cost import DEEPSEEK_V3, PRESETS, RoutingSpec, estimate
    cost = estimate(DEEPSEEK_V3, PRESETS["ubl128"], num_ranks=64, routing=RoutingSpec(seed=0))
    cost.seconds, cost.dispatch.traffic.send    # [R, tiers] bytes each rank sends per tier

Modules: `shape` (MoEShape, the bytes of a row, the Buffer's Exchange), `fabric` (Tier, Fabric),
`routing` (RoutingSpec, row counts through get_dispatch_layout), `traffic` (bytes per rank per
tier), `model` (time per phase and call, ASSUMPTIONS), `presets` (fabrics and published figures
with sources), `report` (text tables), `plot` (time per layer vs EP degree, needs matplotlib).
The command line is `python -m portable_kernels ep-cost`; docs/ep-cost-model.md explains the model.
"""

from .fabric import GB, US, Fabric, Tier, parse_tier
from .model import ASSUMPTIONS, CallCost, LayerCost, PhaseCost, estimate, layer_counts
from .presets import MEASURED, PRESETS, PUBLISHED, PublishedFigure
from .routing import RoutingSpec, RowCounts, row_counts
from .shape import BUFFER_EXCHANGE, DEEPSEEK_V3, EXCHANGES, FP8_FACTOR, ROWS_ONLY, Exchange, MoEShape, header_bytes
from .traffic import CallTraffic, call_traffic

__all__ = [
    "ASSUMPTIONS", "BUFFER_EXCHANGE", "CallCost", "CallTraffic", "DEEPSEEK_V3", "EXCHANGES", "Exchange", "FP8_FACTOR",
    "Fabric", "GB", "LayerCost", "MEASURED", "MoEShape", "PRESETS", "PUBLISHED", "PhaseCost", "PublishedFigure", "ROWS_ONLY",
    "RoutingSpec", "RowCounts", "Tier", "US", "call_traffic", "estimate", "header_bytes", "layer_counts",
    "parse_tier", "row_counts",
]
