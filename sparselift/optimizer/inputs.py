"""What a planning run plans for (`Inputs`): tables, topology, batch, coefficients, and the splits
and hot ids a profile offers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparselift.optimizer.coefficients import Coefficients
from sparselift.optimizer.split_options import SplitOption
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.profiler.hot_ids import HotIds


@dataclass
class Inputs:
    """What a planning run plans for.

    Attributes:
        stats: the tables.
        topo: the target topology.
        batch_size: samples per rank.
        coeffs: the cost coefficients.
        provenance: facts recorded in the plan (profile or workload, topology).
        splits: per table, the splits it may take (`split_options`); none by default.
        hot: the profile's measured hot ids per table, which price the splits of a plan given
            (the profiled plan, a baseline) as `split_options` prices the splits it offers.
    """

    stats: list[TableStats]
    topo: Topology
    batch_size: int
    coeffs: Coefficients
    provenance: dict[str, Any] = field(default_factory=dict)
    splits: dict[str, list[SplitOption]] = field(default_factory=dict)
    hot: dict[str, HotIds] = field(default_factory=dict)
