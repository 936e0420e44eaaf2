"""TorchRec as the referee: its own EmbeddingPerfEstimator's verdict on any plan.

`torchrec_cost` enumerates the options, copies the matching ShardingOption per table, gives it
the plan's shards (size, offset, rank) and its collectives' precision (qcomm codecs),
re-estimates, and reads `NoopPerfModel(topology).rate` (max over ranks of the shards' perf). It
also reads the same per-shard estimates as a synchronous step (Σ over perf parts: fwd compute,
fwd comms, bwd compute, bwd comms, prefetch, of the max over ranks), since each part ends in a
collective every rank waits for; the two readings differ only in the objective.

`storage_verdicts` does the same with TorchRec's EmbeddingStorageEstimator: every rank's storage
under the plan's shards, against the budget TorchRec's planner leaves them
(`HeuristicalStorageReservation` on the topology), so that a check can say whether a plan fits
TorchRec's storage estimate.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import torch

from sparselift import plans
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.optimizer.torchrec_baseline import embedding_model, planner_constraints, tr_topology
from sparselift.plans.baselines import quiet_torchrec as quiet


def all_types_sharders() -> list[Any]:
    """EmbeddingBagCollection and EmbeddingCollection sharders that offer every sharding type
    TorchRec has for each and every kernel on every device: row-wise and table-row-wise run on
    gloo CPU when the plan is built directly, so the referee must be able to score them there
    too."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.types import ShardingType

    def kernels(self: Any, sharding_type: str, compute_device_type: str) -> list[str]:
        if sharding_type == ShardingType.DATA_PARALLEL.value:
            return ["dense"]
        return ["fused", "fused_uvm_caching"] if compute_device_type == "cuda" else ["fused"]

    class BagSharder(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            return [
                t.value
                for t in (
                    ShardingType.DATA_PARALLEL,
                    ShardingType.TABLE_WISE,
                    ShardingType.COLUMN_WISE,
                    ShardingType.TABLE_COLUMN_WISE,
                    ShardingType.ROW_WISE,
                    ShardingType.TABLE_ROW_WISE,
                )
            ]

        compute_kernels = kernels

    class SequenceSharder(EmbeddingCollectionSharder):
        compute_kernels = kernels

    return [BagSharder(), SequenceSharder()]


class Verdict(NamedTuple):
    """TorchRec's estimator on one plan, read two ways (ms)."""

    rate_ms: float  # NoopPerfModel.rate: max over ranks of Σ perf (TorchRec's objective)
    synchronous_ms: (
        float  # Σ over perf parts of max over ranks (the same estimates, a synchronous step)
    )


PERF_PARTS = ("fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms", "prefetch_compute")


def _estimated_options(
    stats: list[TableStats],
    topo: Topology,
    batch_size: int,
    types: dict[str, list[str]],
    kernels: dict[str, list[str]],
    storage: bool = False,
) -> tuple[Any, Any, Any, dict[tuple[str, str, str], Any]]:
    """(TorchRec topology, its estimator, the sharders' data it estimates with, the first enumerated
    ShardingOption per (table, type, kernel) with its per-shard estimate already filled in): the
    perf estimator, or with `storage` the storage estimator (no pipeline)."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import (
        EmbeddingPerfEstimator,
        EmbeddingStorageEstimator,
    )

    trt = tr_topology(topo)
    cons = planner_constraints(stats, types, kernels)
    estimator = (EmbeddingStorageEstimator if storage else EmbeddingPerfEstimator)(
        topology=trt, constraints=cons
    )
    enum = EmbeddingEnumerator(
        topology=trt, batch_size=batch_size, constraints=cons, estimator=[estimator]
    )
    by_key: dict[tuple[str, str, str], Any] = {}
    for o in enum.enumerate(embedding_model(stats), all_types_sharders()):
        by_key.setdefault((o.name, o.sharding_type, o.compute_kernel), o)
    return trt, estimator, getattr(enum, "_sharder_data_map", {}), by_key


def table_estimates(
    stats: list[TableStats],
    topo: Topology,
    batch_size: int,
    sharding_type: str = "table_wise",
    kernel: str = "fused",
) -> dict[str, dict[str, float]]:
    """TorchRec's per-shard estimate of each table as one shard of `sharding_type` / `kernel`:
    what its referee charges a table, to set beside SparseLift's own terms.

    Returns:
        Per table, ms per perf part (PERF_PARTS).
    """
    with quiet():
        *_, by_key = _estimated_options(
            stats,
            topo,
            batch_size,
            {s.name: [sharding_type] for s in stats},
            {s.name: [kernel] for s in stats},
        )
    return {
        name: {k: float(getattr(o.shards[0].perf, k)) for k in PERF_PARTS}
        for (name, _, _), o in sorted(by_key.items())
    }


def _with_precision(sharder_data: dict[str, Any], plan: plans.Plan) -> dict[str, Any]:
    """The sharders' data as this plan runs them: TorchRec's estimator sizes the pooled-embedding
    collectives by the sharder's qcomm codecs, which the plan's comm precision sets (as the
    loader does)."""
    from torchrec.distributed.planner.utils import build_sharder_data

    from sparselift.plans.to_torchrec import precision_sharders

    data = build_sharder_data(
        precision_sharders(plan.comm_precision, torch.device("cpu"))[0]
    )  # dtypes only
    return {key: data for key in sharder_data}


def _types_and_kernels(
    plan_list: list[plans.Plan], stats: list[TableStats]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Per table, the sharding types and the compute kernels the plans use (what to enumerate)."""
    types: dict[str, list[str]] = {s.name: [] for s in stats}
    kernels: dict[str, list[str]] = {s.name: [] for s in stats}
    for p in plan_list:
        for t in p.tables:
            if t.sharding_type not in types[t.name]:
                types[t.name].append(t.sharding_type)
            if t.compute_kernel not in kernels[t.name]:
                kernels[t.name].append(t.compute_kernel)
    return types, kernels


def _plan_options(p: plans.Plan, by_key: dict[tuple[str, str, str], Any]) -> list[Any]:
    """Copies of the enumerated ShardingOptions as plan `p` runs them: its shards (size, offset,
    rank) and its cache load factors (a UVM-cached table is estimated at the share it runs with,
    also where the enumerated option has no cache parameters)."""
    from torchrec.distributed.planner.types import CacheParams, Shard

    chosen = []
    for t in p.tables:
        base = by_key[(t.name, t.sharding_type, t.compute_kernel)]
        o = copy.copy(base)
        o.shards = (
            [Shard(size=list(s.sizes), offset=list(s.offsets), rank=s.rank) for s in t.shards]
            if t.shards
            else [Shard(size=list(base.shards[0].size), offset=[0, 0], rank=r) for r in t.ranks]
        )
        if t.cache_share is not None:
            o.cache_params = copy.copy(o.cache_params) or CacheParams()
            o.cache_params.load_factor = t.cache_share
        chosen.append(o)
    return chosen


def torchrec_cost(
    plan_list: list[plans.Plan], stats: list[TableStats], topo: Topology, batch_size: int
) -> list[Verdict]:
    """TorchRec's EmbeddingPerfEstimator's verdict (ms) on each plan, both readings."""
    from torchrec.distributed.planner.perf_models import NoopPerfModel

    types, kernels = _types_and_kernels(plan_list, stats)
    with quiet():
        trt, estimator, sharder_data, by_key = _estimated_options(
            stats, topo, batch_size, types, kernels
        )
        out = []
        for p in plan_list:
            chosen = _plan_options(p, by_key)
            estimator.estimate(chosen, _with_precision(sharder_data, p))
            parts = {k: [0.0] * topo.world_size for k in PERF_PARTS}
            for o in chosen:
                for sh in o.shards:
                    for k in PERF_PARTS:
                        parts[k][sh.rank] += getattr(sh.perf, k)
            out.append(
                Verdict(float(NoopPerfModel(trt).rate(chosen)), sum(max(v) for v in parts.values()))
            )
    return out


class StorageVerdict(NamedTuple):
    """TorchRec's storage estimate of one plan: every rank's bytes against the budget its planner
    leaves a rank's shards (`HeuristicalStorageReservation(0.15)` of the topology)."""

    hbm_per_rank: list[int]
    ddr_per_rank: list[int]
    hbm_budget: int
    ddr_budget: int

    @property
    def fits(self) -> bool:
        """Whether every rank's HBM and host-memory bytes are within the budget."""
        return max(self.hbm_per_rank) <= self.hbm_budget and max(self.ddr_per_rank) <= (
            self.ddr_budget
        )

    @property
    def busiest_rank(self) -> int:
        """The rank with the most HBM (the lowest of equals)."""
        return max(range(len(self.hbm_per_rank)), key=lambda r: (self.hbm_per_rank[r], -r))


def storage_verdicts(
    plan_list: list[plans.Plan], stats: list[TableStats], topo: Topology, batch_size: int
) -> list[StorageVerdict]:
    """TorchRec's EmbeddingStorageEstimator on each plan, against its planner's budget per rank.

    The plan's shards and cache load factors are given to copies of the enumerated options, as
    `torchrec_cost` does; a plan on the sparse-dist pipeline is estimated under no pipeline and
    under TorchRec's sparse-dist pipeline, every rank at the larger of the two. The budget is
    TorchRec's own reservation run on the topology, the tables (no dense modules: the planner is
    given the tables alone, as `torchrec_baseline` gives them) and the batch.

    Args:
        plan_list: the plans (of these tables, on this topology).
        stats: the tables.
        topo: the target topology (on CPU TorchRec's estimate is in host memory).
        batch_size: samples per rank.
    Returns:
        One StorageVerdict per plan.
    Raises:
        KeyError: a plan's table, sharding type or kernel that TorchRec does not enumerate.
    """
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
    from torchrec.distributed.types import PipelineType

    types, kernels = _types_and_kernels(plan_list, stats)
    with quiet():
        trt, estimator, sharder_data, by_key = _estimated_options(
            stats, topo, batch_size, types, kernels, storage=True
        )
        cons = planner_constraints(stats)
        reserved = HeuristicalStorageReservation(percentage=0.15).reserve(
            trt, batch_size, embedding_model(stats), all_types_sharders(), cons
        )
        budget = reserved.devices[0].storage
        sparse = EmbeddingStorageEstimator(
            topology=trt, constraints=cons, pipeline_type=PipelineType.TRAIN_SPARSE_DIST
        )
        out = []
        for p in plan_list:
            hbm, ddr = [0] * topo.world_size, [0] * topo.world_size
            for est in [estimator] + ([sparse] if p.pipeline == "sparse-dist" else []):
                chosen = _plan_options(p, by_key)
                est.estimate(chosen, sharder_data)
                h, d = [0] * topo.world_size, [0] * topo.world_size
                for o in chosen:
                    for sh in o.shards:
                        h[sh.rank] += sh.storage.hbm
                        d[sh.rank] += sh.storage.ddr
                hbm = [max(a, b) for a, b in zip(hbm, h, strict=True)]
                ddr = [max(a, b) for a, b in zip(ddr, d, strict=True)]
            out.append(StorageVerdict(hbm, ddr, int(budget.hbm), int(budget.ddr)))
    return out
