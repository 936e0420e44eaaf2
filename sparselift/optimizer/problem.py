"""What one solve answers, the terms it reads, and what it returns.

A `Problem` holds the tables, the cost model and every table's feasible option classes, and
computes once the table of terms the formulation and the placement read: one `Terms` (the phase
times and memory one shard puts on a rank, by where the rank sits) per (table, option class).
Reading that table, rather than asking the cost model again, keeps the solver's code in one place
and the cost model's in another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sparselift.optimizer.coefficients import Coefficients
from sparselift.optimizer.cost_model import CostModel, sum_rank_loads
from sparselift.optimizer.costs import RankLoad, Terms
from sparselift.optimizer.space import Choice, OptionClass, PlanWide
from sparselift.optimizer.split_options import SplitOption
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.optimizer.torchrec_storage import hbm_budget

NS = 1e9  # the CP-SAT model's time unit: integer nanoseconds (memory: integer bytes)


@dataclass
class Problem:
    """Everything one solve needs, with the terms it reads computed on construction.

    Args:
        stats: the tables, in the order the plan lists them.
        model: the cost model of the target (topology, per-rank batch, coefficients).
        plan_wide: the collective precision, decided before solving; its pipeline is not read (the
            solver decides the pipeline).
        classes: per table, the option classes still feasible for it.
        allow_sparse_dist: whether the sparse-dist pipeline may be chosen (`robust`: only when
            measured faster, `pipeline_pays`).
        risky: the (table, class) pairs the secondary objective counts as risky.
        risk_penalty_ns: the objective's penalty per risky choice (and for the pipeline), in
            nanoseconds; 0 turns the secondary objective off.
        splits: per model table, the splits it may take instead (`split_options`); every part
            needs its classes in `classes` (an option with a part without any is not offered).

    Derived: `tables` (every table a class is chosen for: the model's, then each option's parts),
    `by_name` (their stats by name), `term_table` (Terms per (table, class) of `classes`),
    `hbm_cap` / `ddr_cap` (bytes per rank the tables may use; HBM: no more than TorchRec's
    planner leaves them, `torchrec_storage.hbm_budget`) and `pipeline_buffer_bytes` (what the
    sparse-dist pipeline adds to every rank).
    """

    stats: list[TableStats]
    model: CostModel
    plan_wide: PlanWide
    classes: dict[str, list[OptionClass]]
    allow_sparse_dist: bool = True
    risky: frozenset[tuple[str, OptionClass]] = frozenset()
    risk_penalty_ns: int = 0
    splits: dict[str, list[SplitOption]] = field(default_factory=dict)
    tables: list[TableStats] = field(init=False, repr=False)
    by_name: dict[str, TableStats] = field(init=False, repr=False)
    term_table: dict[tuple[str, OptionClass], Terms] = field(init=False, repr=False)
    hbm_cap: int = field(init=False)
    ddr_cap: int = field(init=False)
    pipeline_buffer_bytes: float = field(init=False)

    def __post_init__(self) -> None:
        self.splits = {
            name: kept
            for name, opts in self.splits.items()
            if (kept := [o for o in opts if all(self.classes.get(q.name) for q in o.parts)])
        }
        self.tables = [*self.stats, *(q for o in self.options() for q in o.parts)]
        self.by_name = {s.name: s for s in self.tables}
        self.term_table = {
            (s.name, c): self.model.terms(s, c, self.plan_wide)
            for s in self.tables
            for c in self.classes[s.name]
        }
        topo = self.model.topo
        self.hbm_cap = hbm_budget(topo, self.model.batch_size, self.stats)
        self.ddr_cap = topo.usable(topo.ddr_bytes)
        self.pipeline_buffer_bytes = self.model.pipeline_buffer_bytes(self.stats)

    @property
    def topo(self) -> Topology:
        """The target topology."""
        return self.model.topo

    @property
    def coeffs(self) -> Coefficients:
        """The cost coefficients (fixed per-call costs, overlaps, the dense step)."""
        return self.model.coeffs

    @property
    def on_gpu(self) -> bool:
        """Whether tables live in HBM (CUDA) rather than in host memory (CPU)."""
        return self.model.topo.device == "cuda"

    def terms(self, name: str, cls: OptionClass) -> Terms:
        """The terms of table `name` under `cls`, from the table; a class outside `classes` (a
        warm start's, a caller's) is priced on first use and kept."""
        key = (name, cls)
        if key not in self.term_table:
            self.term_table[key] = self.model.terms(self.by_name[name], cls, self.plan_wide)
        return self.term_table[key]

    def options(self) -> list[SplitOption]:
        """Every split offered, in table order."""
        return [o for s in self.stats for o in self.splits.get(s.name, ())]

    def alternatives(self, name: str) -> list[tuple[str, ...]]:
        """The ways model table `name` may be run: itself, then each split's parts."""
        return [(name,), *(o.part_names for o in self.splits.get(name, ()))]

    def count_placements(self) -> int:
        """The exact model's size: one boolean per (table, class, rank or host), 1 for classes
        on every rank."""
        t = self.topo
        n = 0
        for s in self.tables:
            for c in self.classes[s.name]:
                if c.located == "rank":
                    n += t.world_size
                else:
                    n += t.num_hosts if c.located == "host" else 1
        return n

    def rank_loads(self, choices: Mapping[str, Choice]) -> list[RankLoad]:
        """Per rank, the phase seconds (no fixed per-call costs) and memory bytes of `choices`."""
        return sum_rank_loads(
            self.topo, ((ch, self.terms(name, ch.cls)) for name, ch in choices.items())
        )


def load_over_ranks(terms: Terms, cls: OptionClass, world: int, local: int) -> list[float]:
    """One table option's phase seconds and memory bytes summed over all `world` ranks (`local`
    per host): what the decomposed formulation averages and the cheapest start compares."""
    if terms.located == "all":
        return [world * x for x in terms.own]
    if terms.located == "host":
        return [
            local * o + (world - local) * r
            for o, r in zip(terms.own, terms.remote_inter, strict=True)
        ]
    return [
        cls.shards * (own + (local - 1) * intra + (world - local) * inter)
        for own, intra, inter in zip(terms.own, terms.remote_intra, terms.remote_inter, strict=True)
    ]


@dataclass
class Solution:
    """One solve's answer and its record.

    Attributes:
        choices: every table's option and placement.
        pipeline: the train pipeline chosen ("base" or "sparse-dist").
        status: CP-SAT's status name (OPTIMAL / FEASIBLE), `_WALL_LIMIT` appended when the wall
            clock stopped it (then it may not repeat exactly).
        objective_s: the solver's objective in seconds (its model, the dense step included).
        bound_s: the proven lower bound in seconds.
        det_time_s: CP-SAT's deterministic time.
        wall_s: wall seconds of the solve (waiting for a warm start excluded).
        mode: "exact" or "decomposed".
        seed: CP-SAT's random seed.
        workers: CP-SAT's worker count.
    """

    choices: dict[str, Choice]
    pipeline: str
    status: str
    objective_s: float
    bound_s: float
    det_time_s: float
    wall_s: float
    mode: str
    seed: int
    workers: int
