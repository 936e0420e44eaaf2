"""The cost model's data: a step's phases, what one option puts on a rank, and a plan's cost.

Shared by the cost model (`cost_model`), the CP-SAT formulation and the plan readers, so that they
name phases and loads alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sparselift.optimizer.space import PlanWide

PHASES = (
    "input_dist",
    "lookup_fwd",
    "output_dist_fwd",
    "output_dist_bwd",
    "lookup_bwd",
    "dp_allreduce",
)
COMPUTE_PHASES = ("lookup_fwd", "lookup_bwd")


class PhaseTimes(NamedTuple):
    """Seconds per phase of a step (one rank's, or the fixed per-call costs)."""

    input_dist: float = 0.0
    lookup_fwd: float = 0.0
    output_dist_fwd: float = 0.0
    output_dist_bwd: float = 0.0
    lookup_bwd: float = 0.0
    dp_allreduce: float = 0.0


class RankLoad(NamedTuple):
    """What a rank carries: seconds per phase, then memory bytes.

    A tuple, so that `np.array(loads)` gives one row per rank with the columns in this order
    (`LOAD_WIDTH` of them; the memory columns from `HBM_COL`).
    """

    input_dist: float = 0.0
    lookup_fwd: float = 0.0
    output_dist_fwd: float = 0.0
    output_dist_bwd: float = 0.0
    lookup_bwd: float = 0.0
    dp_allreduce: float = 0.0
    hbm_bytes: float = 0.0
    ddr_bytes: float = 0.0


LOAD_WIDTH = len(RankLoad._fields)  # columns of a load array
HBM_COL, DDR_COL = RankLoad._fields.index("hbm_bytes"), RankLoad._fields.index("ddr_bytes")
assert RankLoad._fields[: len(PHASES)] == PHASES == PhaseTimes._fields


@dataclass(frozen=True)
class Terms:
    """The load one shard of a table's option puts on a rank, by where the rank sits.

    Attributes:
        located: "all" (replicated / row-wise: every rank is "own"), "rank" (table-wise /
            column-wise shards on chosen ranks) or "host" (table-row-wise on a chosen host).
        shards: the option's shard count.
        own: on a rank holding the shard (every rank for "all"; the host's ranks for "host").
        remote_intra: on another rank of the shard's host.
        remote_inter: on a rank of another host.
    """

    located: str
    shards: int
    own: RankLoad
    remote_intra: RankLoad
    remote_inter: RankLoad


@dataclass(frozen=True)
class RankCost:
    """One rank's predicted cost: compute (lookups + dense) and communication seconds (fixed
    per-call costs included), and memory bytes (`memory_bytes`: where the tables live)."""

    rank: int
    compute_s: float
    comm_s: float
    memory_bytes: int
    hbm_bytes: int
    ddr_bytes: int


@dataclass
class PlanCost:
    """A plan's predicted step and what makes it up.

    Attributes:
        step_time_s: dense step + Σ phases_s + spread_s.
        phases_s: per phase, max over ranks with fixed costs (input_dist as left exposed).
        per_rank: every rank's cost.
        dense_step_s: the dense part of the step.
        plan_wide: the precision and pipeline it was priced with.
        spread_s: of step_time_s, how much later than the largest prediction the slowest
            rank's lookups end on average (`cost_model.CostModel.spread_s`).
    """

    step_time_s: float
    phases_s: dict[str, float]
    per_rank: list[RankCost]
    dense_step_s: float
    plan_wide: PlanWide = field(default_factory=PlanWide)
    spread_s: float = 0.0

    def predicted(self) -> dict[str, Any]:
        """The plan file's `predicted` block."""
        return {
            "step_time_s": self.step_time_s,
            "spread_s": self.spread_s,
            "per_rank": [
                {
                    "rank": r.rank,
                    "compute_s": r.compute_s,
                    "comm_s": r.comm_s,
                    "memory_bytes": r.memory_bytes,
                }
                for r in self.per_rank
            ],
        }
