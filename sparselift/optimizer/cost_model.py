"""The incremental cost model: a plan's step time as a sum of per-decision terms.

A step is bulk-synchronous: every collective waits for the slowest rank, so the step time is

    dense_step + Σ_phase max_rank phase_time[rank]        (phases: input_dist, lookup_fwd,
                                                           output_dist_fwd, output_dist_bwd,
                                                           lookup_bwd, dp_allreduce)

which is ≥ the slowest rank's fwd+bwd compute plus its exposed communication, and what CP-SAT
minimizes (one max variable per phase). Where ranks share cores (`Coefficients.crowd_factor`,
`crowding`), `evaluate` also takes the step to last at least crowd_factor × the mean rank's work.
Each table's option contributes, to each rank, a `RankLoad` (phase times and memory bytes),
depending only on whether the rank holds one of its shards ("own"), sits on the same host as a
shard ("remote_intra") or on another host ("remote_inter"). That makes every rank's load a
linear expression of the choice variables.

A collective's bytes are charged where it is unbalanced: a table-wise or column-wise shard's rank
receives every rank's ids and output gradients and sends its outputs (ids spread over many owners
leave the senders even), row-wise shards their even share. On CPU (gloo) they are charged at both
ends, as each rank's own CPU copies what it sends and what it receives (`kernels.both_ends`): the
other ranks of the shard's host pay for their side too.

Two caches keep it incremental: resource *counts* per (table stats, option class) (`counts`) and
*terms* (counts × coefficients) per (stats, class, coefficients, precision). A changed table's
stats miss only its own entries; a changed coefficient only re-multiplies cached counts. Fixed
per-call costs (the a_s of a fit) are counted once per group present: one input and one output
collective per (collection, sharding type), one TBE per (collection, sharding type, kernel), as
TorchRec batches them (each collection, e.g. an EmbeddingCollection beside an
EmbeddingBagCollection, runs its own).

A row-wise or table-row-wise table's output distribution is a reduce-scatter (gloo: an
all-reduce), not an all-to-all: its bytes, and its type's fixed cost, are priced with the
reduce-scatter coefficients (`output_coeffs`, `type_fixed_costs`), in the same output phases.

A data-parallel table's backward runs FBGEMM's dense TBE, with no fused optimizer: its work is
priced at `dense_bwd_scale` × lookup_bwd's per-unit cost (measured where a profile ran such
tables), plus the whole-table optimizer pass (`dense_grad_b_s`) and the gradient all-reduce.

A virtual table of a split (`split_options`) is priced as any table, plus, on every rank and in
lookup_fwd (both run in the step, outside the collectives), the loader's batch transform (its ids
routed and its share of the split features' calls) and the split model's recombination (its
pooled block read; a split model also writes the whole pooled output once more,
`recombine_fixed_s`), each at ASSUMED_TRANSFORM_MARGIN × its cost where no split plan's steps
timed it (`coefficients`: then assumed).

Each rank's lookups are predicted with an error (`Coefficients.rank_spread` of its own lookups,
measured by the calibration): a plan balanced on the predictions is balanced on their errors too,
so `evaluate` adds how much later than the largest prediction the slowest rank ends on average
(`spread_s`, `sparselift.spread`). CP-SAT minimizes the makespan without it; the plans it finds
are compared, with each other and with the baselines, at their evaluated step.

Memory per rank: weights + row-wise Adagrad state (one float per row) + the whole-table gradient of
the dense kernel / data-parallel + UVM cache in HBM (table in host memory) + the sparse-dist
pipeline's extra batch of ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import NamedTuple

from sparselift.kernels import FLOAT_BYTES, ID_BYTES, LENGTH_BYTES, LookupUnit
from sparselift.optimizer.coefficients import Coefficients, Linear
from sparselift.optimizer.costs import (
    COMPUTE_PHASES,
    LOAD_WIDTH,
    PHASES,
    PhaseTimes,
    PlanCost,
    RankCost,
    RankLoad,
    Terms,
)
from sparselift.optimizer.counts import ClassCounts, Counts, class_counts
from sparselift.optimizer.space import DP, RW, TWRW, Choice, OptionClass, PlanWide
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.spread import premium_s

PRECISION_FACTOR = {"fp32": 1.0, "fp16": 0.5, "bf16": 0.5}
# a split model's own costs are priced at this × their stand-alone fit where no split plan's
# steps timed them
ASSUMED_TRANSFORM_MARGIN = 2.0


def recombine_b_s(coeffs: Coefficients) -> float:
    """The recombination's seconds per element as priced: at ASSUMED_TRANSFORM_MARGIN × the
    preset's where no profile measured it."""
    measured = coeffs.measured("recombine_b_s")
    return coeffs.recombine_b_s * (1.0 if measured else ASSUMED_TRANSFORM_MARGIN)


def output_coeffs(coeffs: Coefficients, sharding_type: str) -> tuple[Linear, Linear]:
    """The (forward, backward) output-distribution coefficients of a sharding type: the
    reduce-scatter's for row-wise and table-row-wise, the all-to-all's for the others."""
    if sharding_type in (RW, TWRW):
        return coeffs.output_dist_rs_fwd, coeffs.output_dist_rs_bwd
    return coeffs.output_dist_fwd, coeffs.output_dist_bwd


def type_fixed_costs(coeffs: Coefficients, sharding_type: str) -> PhaseTimes:
    """The fixed costs one sharding type present adds (data-parallel excepted): its input_dist
    and its output collective, forward and backward (`output_coeffs`), and the framework work
    around them (`type_overhead_s`, with the forward lookup's)."""
    fwd, bwd = output_coeffs(coeffs, sharding_type)
    return PhaseTimes(
        input_dist=coeffs.input_dist.a_s,
        lookup_fwd=coeffs.type_overhead_s,
        output_dist_fwd=fwd.a_s,
        output_dist_bwd=bwd.a_s,
    )


class Group(NamedTuple):
    """The calls a table's shards run in: one TBE per group, one input_dist and one output
    collective per (collection, sharding type)."""

    collection: str  # the table's collection ("" where not recorded: one for all)
    sharding_type: str
    kernel: str


def group_of(t: TableStats, cls: OptionClass) -> Group:
    """The group table `t` runs in under class `cls`."""
    return Group(t.collection or "", cls.sharding_type, cls.kernel)


class CostModel:
    """Terms for one target (topology, per-rank batch); coefficients and precision are arguments.

    Args:
        topo: the target topology.
        batch_size: samples per rank.
        coeffs: the cost coefficients (may be replaced later: terms are cached per coefficients).
    """

    def __init__(self, topo: Topology, batch_size: int, coeffs: Coefficients) -> None:
        self.topo, self.batch_size, self.coeffs = topo, batch_size, coeffs
        self._counts = lru_cache(maxsize=None)(self._counts_uncached)
        self._terms = lru_cache(maxsize=None)(self._terms_uncached)

    def counts(self, t: TableStats, c: OptionClass) -> ClassCounts:
        """What one shard of table `t` under class `c` makes a rank do (cached), counting lookup
        work in the coefficients' unit."""
        return self._counts(t, c, self.coeffs.lookup_unit)

    def _counts_uncached(self, t: TableStats, c: OptionClass, unit: LookupUnit) -> ClassCounts:
        return class_counts(self.topo, self.batch_size, t, c, unit)

    def terms(self, t: TableStats, c: OptionClass, plan_wide: PlanWide | None = None) -> Terms:
        """The load one shard of table `t` under class `c` puts on each kind of rank, at the
        collective precision of `plan_wide` (default fp32; its pipeline is not read)."""
        plan_wide = plan_wide or PlanWide()
        return self._terms(t, c, self.coeffs, plan_wide.forward, plan_wide.backward)

    def _terms_uncached(
        self, t: TableStats, c: OptionClass, coeffs: Coefficients, fwd: str, bwd: str
    ) -> Terms:
        cc = self.counts(t, c)
        ff, fb = PRECISION_FACTOR[fwd], PRECISION_FACTOR[bwd]
        out_fwd, out_bwd = output_coeffs(coeffs, c.sharding_type)

        def out(intra: float, inter: float, b: float, f: float) -> float:
            t_ = b * intra + coeffs.inter_host_b_s * inter
            if f == 1.0:
                return t_
            # fewer bytes on the wire (host work per byte stays); quantized at the sender and
            # dequantized at the receiver, per element
            q = 2.0 * coeffs.quantize_b_s / FLOAT_BYTES
            t_ += (q - (1.0 - f) * coeffs.inter_host_b_s) * inter
            if coeffs.qcomm_net_s is not None:  # inside the host: as a profile measured it
                return t_ + coeffs.qcomm_net_s * intra / FLOAT_BYTES
            return t_ + (q - (1.0 - f) * min(b, coeffs.wire_b_s)) * intra

        # an assumed transform cost is priced at a margin: a split must pay even if it is off
        margin = 1.0 if coeffs.measured("batch_transform") else ASSUMED_TRANSFORM_MARGIN
        tx_a, tx_b = (margin * x for x in (coeffs.batch_transform.a_s, coeffs.batch_transform.b_s))
        rec_b = recombine_b_s(coeffs)
        # the dense TBE's backward (data-parallel tables) costs its own multiple per unit
        bwd_b = coeffs.lookup_bwd.b_s * (coeffs.dense_bwd_scale if c.sharding_type == DP else 1.0)

        def load(n: Counts) -> RankLoad:
            return RankLoad(
                coeffs.input_dist.b_s * n.ids_intra + coeffs.inter_host_b_s * n.ids_inter,
                coeffs.lookup_fwd.b_s * n.fwd_work
                + coeffs.uvm_miss_b_s * n.miss_x
                + tx_a * n.routed_features
                + tx_b * n.routed_ids
                + rec_b * n.recombined_x,
                out(n.out_fwd_intra, n.out_fwd_inter, out_fwd.b_s, ff),
                out(n.out_bwd_intra, n.out_bwd_inter, out_bwd.b_s, fb),
                bwd_b * n.bwd_work
                + coeffs.uvm_miss_b_s * n.miss_x
                + coeffs.dense_grad_b_s * n.dense_grad_x,
                (1.0 - coeffs.dp_overlap)
                * (coeffs.dp_allreduce.b_s * n.ar_intra + coeffs.inter_host_b_s * n.ar_inter),
                n.hbm,
                n.ddr,
            )

        return Terms(
            cc.located, cc.shards, load(cc.own), load(cc.remote_intra), load(cc.remote_inter)
        )

    def fixed_call_costs(self, groups: Iterable[Group]) -> PhaseTimes:
        """Fixed costs of the groups present: one input_dist, one output collective and the
        framework work per (collection, sharding type) (`type_fixed_costs`), one TBE per
        group, one allreduce for all data-parallel tables."""
        coeffs = self.coeffs
        groups = set(groups)
        per_type = [
            type_fixed_costs(coeffs, st)
            for _, st in sorted({g[:2] for g in groups if g.sharding_type != DP})
        ]
        return PhaseTimes(
            sum(f.input_dist for f in per_type),
            coeffs.lookup_fwd.a_s * len(groups) + sum(f.lookup_fwd for f in per_type),
            sum(f.output_dist_fwd for f in per_type),
            sum(f.output_dist_bwd for f in per_type),
            coeffs.lookup_bwd.a_s * len(groups),
            (1.0 - coeffs.dp_overlap)
            * coeffs.dp_allreduce.a_s
            * (1 if any(g.sharding_type == DP for g in groups) else 0),
        )

    def recombine_fixed_s(self, stats: Mapping[str, TableStats], choices: Iterable[str]) -> float:
        """What a split model's recombination costs every rank beyond its parts' reads: writing
        the model's whole pooled output (0 without a split)."""
        tables = [stats[n] for n in choices]
        if not any(t.split_of is not None for t in tables):
            return 0.0
        return self.recombine_whole_s(tables)

    def recombine_whole_s(self, tables: Iterable[TableStats]) -> float:
        """Writing the pooled output of `tables` (the model's, or a plan's parts standing in for
        theirs) once: seconds per rank and step."""
        width = sum(t.embedding_dim * max(1, len(t.feature_names)) * t.output_share for t in tables)
        return recombine_b_s(self.coeffs) * self.batch_size * width

    def pipeline_buffer_bytes(self, stats: Iterable[TableStats]) -> float:
        """Bytes the sparse-dist pipeline adds to every rank: one more batch of ids (all
        tables, as received)."""
        return (
            sum(
                self.batch_size
                * self.topo.world_size
                * (s.ids_per_sample * ID_BYTES + LENGTH_BYTES)
                for s in stats
            )
            / max(1, self.topo.world_size)
            * 2
        )

    def rank_loads(
        self,
        stats: Mapping[str, TableStats],
        choices: Mapping[str, Choice],
        plan_wide: PlanWide | None = None,
    ) -> list[RankLoad]:
        """Every rank's load (phase seconds without fixed costs, memory bytes) under `choices`
        at the collective precision of `plan_wide` (default fp32)."""
        return sum_rank_loads(self.topo, self.placed(stats, choices, plan_wide))

    def placed(
        self,
        stats: Mapping[str, TableStats],
        choices: Mapping[str, Choice],
        plan_wide: PlanWide | None = None,
    ) -> list[tuple[Choice, Terms]]:
        """Each table's choice with its terms at the precision of `plan_wide`, in `choices`'
        order: what `sum_rank_loads` adds up."""
        return [(ch, self.terms(stats[name], ch.cls, plan_wide)) for name, ch in choices.items()]

    def evaluate(
        self,
        stats: Mapping[str, TableStats],
        choices: Mapping[str, Choice],
        plan_wide: PlanWide | None = None,
    ) -> PlanCost:
        """Price a plan: its step time, phase maxima and every rank's cost and memory.

        Args:
            stats: statistics by table name (at least every table of `choices`).
            choices: every table's option and placement.
            plan_wide: the plan's collective precision and pipeline (default fp32, base).
        Returns:
            The plan's PlanCost (memory is reported, not checked against the topology).
        Raises:
            KeyError: a table of `choices` has no statistics.
        """
        plan_wide = plan_wide or PlanWide()
        placed = self.placed(stats, choices, plan_wide)
        loads = sum_rank_loads(self.topo, placed)
        fixed = self.fixed_call_costs(group_of(stats[n], ch.cls) for n, ch in choices.items())
        coeffs = self.coeffs
        phases = {
            ph: max(getattr(load, ph) for load in loads) + getattr(fixed, ph) for ph in PHASES
        }
        phases["lookup_fwd"] += self.recombine_fixed_s(stats, choices)
        sparse_dist = plan_wide.pipeline == "sparse-dist"
        buffer = self.pipeline_buffer_bytes(stats[n] for n in choices) if sparse_dist else 0.0
        if sparse_dist:
            phases["input_dist"] = (1.0 - coeffs.pipeline_overlap) * phases[
                "input_dist"
            ] + coeffs.pipeline_overhead_s
        spread = self.spread_s(placed, loads)
        step = coeffs.dense_step_s + sum(phases.values()) + spread
        gpu = self.topo.device == "cuda"
        per_rank = []
        for q, load in enumerate(loads):
            compute = sum(getattr(load, ph) + getattr(fixed, ph) for ph in COMPUTE_PHASES)
            comm = sum(
                getattr(load, ph) + getattr(fixed, ph) for ph in PHASES if ph not in COMPUTE_PHASES
            )
            per_rank.append(
                RankCost(
                    rank=q,
                    compute_s=compute + coeffs.dense_step_s,
                    comm_s=comm,
                    memory_bytes=int((load.hbm_bytes if gpu else load.ddr_bytes) + buffer),
                    hbm_bytes=int(load.hbm_bytes),
                    ddr_bytes=int(load.ddr_bytes + (0 if gpu else buffer)),
                )
            )
        if coeffs.crowd_factor > 0:  # ranks that share cores (`crowding`)
            step = max(step, coeffs.crowd_factor * mean_rank_work_s(per_rank))
        return PlanCost(
            step_time_s=step,
            phases_s=phases,
            per_rank=per_rank,
            dense_step_s=coeffs.dense_step_s,
            plan_wide=plan_wide,
            spread_s=spread,
        )

    def spread_s(self, placed: list[tuple[Choice, Terms]], loads: list[RankLoad]) -> float:
        """How much later than predicted the slowest rank's lookups end on average
        (`sparselift.spread.premium_s`): each rank's own lookups (not those of tables every
        rank holds: `located == "all"`, which err alike on every rank) err by
        `Coefficients.rank_spread` of them. 0.0 at no spread.

        Args:
            placed: (choice, its terms) per table, as `loads` was summed from.
            loads: every rank's load (`sum_rank_loads`).
        """
        if self.coeffs.rank_spread <= 0:
            return 0.0
        shared = sum(t.own.lookup_fwd + t.own.lookup_bwd for _, t in placed if t.located == "all")
        means = [ld.lookup_fwd + ld.lookup_bwd for ld in loads]
        sigmas = [self.coeffs.rank_spread * max(0.0, m - shared) for m in means]
        return premium_s(means, sigmas)


def mean_rank_work_s(per_rank: list[RankCost]) -> float:
    """The mean rank's work in a step: its dense step, lookups and collectives (`RankCost`)."""
    return sum(r.compute_s + r.comm_s for r in per_rank) / max(1, len(per_rank))


def sum_rank_loads(topo: Topology, placed: Iterable[tuple[Choice, Terms]]) -> list[RankLoad]:
    """Every rank's load: the terms of the placed options, summed in the order given.

    Args:
        topo: the topology (ranks, hosts).
        placed: (choice, its terms) per table.
    Returns:
        One RankLoad per rank.
    """
    W, L = topo.world_size, topo.local_world_size
    loads = [[0.0] * LOAD_WIDTH for _ in range(W)]
    for ch, terms in placed:
        if terms.located == "all":
            for q in range(W):
                _add(loads[q], terms.own)
        elif terms.located == "host":
            for q in range(W):
                _add(loads[q], terms.own if topo.host_of(q) == ch.host else terms.remote_inter)
        else:
            for r in ch.ranks:
                for q in range(W):
                    if q == r:
                        _add(loads[q], terms.own)
                    elif q // L == r // L:
                        _add(loads[q], terms.remote_intra)
                    else:
                        _add(loads[q], terms.remote_inter)
    return [RankLoad(*load) for load in loads]


def _add(acc: list[float], load: RankLoad) -> None:
    for i, x in enumerate(load):
        acc[i] += x
