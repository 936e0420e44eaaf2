"""TorchRec's own estimate of every option SparseLift can choose, shard by shard, and its verdict
on a plan computed from those estimates without running TorchRec again.

TorchRec's EmbeddingPerfEstimator prices a shard from its table, sharding type, kernel, cache
load factor, shard size, the batch, the topology and the collectives' precision alone: not from
the rank it sits on, nor from the other tables. `NoopPerfModel.rate` (what TorchRec's planner
minimizes) is then the max over ranks of the summed `Perf.total` of the shards on each rank. So
one estimate per distinct shard size of each (table, option class) prices every plan that uses
these classes: `TorchRecPrices.rate_s`. Why: planning for hardware no profile measured, SparseLift
prices options as TorchRec does (`whatif`), thousands of plans are compared during one planning
run, and running TorchRec's estimator on each would take seconds per plan.

The shards are laid out as `planio.table_plan` writes them (row blocks of ceil(rows / n), equal
column blocks; every rank holds a data-parallel table whole), so a price is that of the plan
file the optimizer writes; `torchrec_referee.torchrec_cost` runs TorchRec's estimator on such a
file, and the tests hold the two to the same verdict.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from sparselift import plans
from sparselift.optimizer.planio import table_plan
from sparselift.optimizer.space import CW, DP, TW, UVM_CACHING, Choice, OptionClass
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.optimizer.torchrec_baseline import embedding_model, planner_constraints, tr_topology
from sparselift.optimizer.torchrec_referee import all_types_sharders
from sparselift.plans.baselines import quiet_torchrec as quiet

MS = 1e-3  # TorchRec's estimates are in ms (its bandwidths are bytes/ms): seconds per ms
TOTAL_PARTS = ("fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms", "prefetch_compute")


class _NoEstimate:
    """A ShardEstimator that leaves options unestimated: enumeration alone is cheap; what is
    estimated is chosen here."""

    def estimate(self, sharding_options: Any, sharder_data_map: Any = None) -> None:
        """Nothing: the options are estimated later, only the shards that are priced."""


def canonical_choice(c: OptionClass) -> Choice:
    """`c` placed on the first ranks (or host 0): TorchRec's estimate does not depend on where."""
    if c.located == "rank":
        return Choice(c, ranks=tuple(range(c.shards)))
    if c.located == "host":
        return Choice(c, host=0)
    return Choice(c)


def shard_sizes(t: TableStats, c: OptionClass, topo: Topology) -> list[tuple[int, int]]:
    """(rows, columns) of each shard of table `t` under class `c`, in the plan's shard order (a
    data-parallel table: one whole copy per rank)."""
    if c.sharding_type == DP:
        return [(t.num_embeddings, t.embedding_dim)] * topo.world_size
    tp = table_plan(t, canonical_choice(c), topo)
    return [(s.sizes[0], s.sizes[1]) for s in tp.shards]


class TorchRecPrices:
    """TorchRec's per-shard estimate (`Perf.total`, seconds) of each (table, class), at one
    collective precision, priced on first use and kept.

    Args:
        stats: the tables (every table a price is asked for).
        topo: the target topology.
        batch_size: samples per rank.
        precision: the collectives' precision (TorchRec sizes the pooled-embedding collectives
            by the sharder's qcomm codecs).
    """

    def __init__(
        self,
        stats: list[TableStats],
        topo: Topology,
        batch_size: int,
        precision: plans.CommPrecision | None = None,
    ) -> None:
        self.topo, self.batch_size = topo, batch_size
        self.precision = precision or plans.CommPrecision()
        self.by_name = {s.name: s for s in stats}
        self._shards: dict[tuple[str, OptionClass], tuple[float, ...]] = {}
        self._base: dict[str, Any] | None = None
        self._stats = stats

    # ------------------------------------------------------------------------------- pricing
    def _setup(self) -> None:
        """Enumerate one option per table (table-wise, fused; unestimated) to copy from, and
        TorchRec's estimator and sharder data at this precision."""
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
        from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator
        from torchrec.distributed.planner.utils import build_sharder_data

        from sparselift.plans.to_torchrec import precision_sharders

        stats = self._stats
        with quiet():
            self._trt = tr_topology(self.topo)
            cons = planner_constraints(
                stats, {s.name: [TW] for s in stats}, {s.name: ["fused"] for s in stats}
            )
            self._estimator = EmbeddingPerfEstimator(topology=self._trt, constraints=cons)
            enum = EmbeddingEnumerator(
                topology=self._trt,
                batch_size=self.batch_size,
                constraints=cons,
                estimator=[_NoEstimate()],
            )
            options = enum.enumerate(embedding_model(stats), all_types_sharders())
            keys = getattr(enum, "_sharder_data_map", {})
            data = build_sharder_data(precision_sharders(self.precision, torch.device("cpu"))[0])
        self._sharder_data = {key: data for key in keys}
        self._base = {o.name: o for o in options}

    def price(self, pairs: Iterable[tuple[str, OptionClass]]) -> None:
        """Estimate every (table, class) of `pairs` not priced yet, in one call of TorchRec's
        estimator (one shard per distinct shard size).

        Raises:
            KeyError: a table that is not one of `stats`.
        """
        from torchrec.distributed.planner.types import CacheParams, Shard

        todo = [(n, c) for n, c in dict.fromkeys(pairs) if (n, c) not in self._shards]
        if not todo:
            return
        if self._base is None:
            self._setup()
        assert self._base is not None
        options, layouts = [], []
        for name, c in todo:
            sizes = shard_sizes(self.by_name[name], c, self.topo)
            distinct = list(dict.fromkeys(sizes))
            o = copy.copy(self._base[name])
            o.sharding_type = "column_wise" if c.sharding_type == CW else c.sharding_type
            o.compute_kernel = c.kernel
            o.shards = [Shard(size=[r, d], offset=[0, 0]) for r, d in distinct]
            o.cache_params = (
                CacheParams(load_factor=c.cache_load_factor) if c.kernel == UVM_CACHING else None
            )
            options.append(o)
            layouts.append((sizes, distinct))
        with quiet():
            self._estimator.estimate(options, self._sharder_data)
        for (name, c), o, (sizes, distinct) in zip(todo, options, layouts, strict=True):
            by_size = {
                sz: sum(float(getattr(sh.perf, k)) for k in TOTAL_PARTS) * MS
                for sz, sh in zip(distinct, o.shards, strict=True)
            }
            self._shards[name, c] = tuple(by_size[sz] for sz in sizes)

    def shards(self, name: str, c: OptionClass) -> tuple[float, ...]:
        """TorchRec's `Perf.total` (seconds) of each shard of table `name` under `c`, in the
        plan's shard order."""
        if (name, c) not in self._shards:
            self.price([(name, c)])
        return self._shards[name, c]

    # ------------------------------------------------------------------------------- verdicts
    def rank_totals(self, choices: Mapping[str, Choice]) -> list[float]:
        """Every rank's summed `Perf.total` (seconds) under `choices`."""
        self.price((n, ch.cls) for n, ch in choices.items())
        out = [0.0] * self.topo.world_size
        for name, ch in choices.items():
            for r, x in zip(ch.plan_ranks(self.topo), self.shards(name, ch.cls), strict=True):
                out[r] += x
        return out

    def rate_s(self, choices: Mapping[str, Choice]) -> float:
        """TorchRec's verdict on `choices` (`NoopPerfModel.rate`, in seconds): the max over
        ranks of the summed per-shard estimates."""
        return max(self.rank_totals(choices), default=0.0)
