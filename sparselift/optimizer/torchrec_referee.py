"""TorchRec as the referee: its own EmbeddingPerfEstimator's verdict on any plan.

`torchrec_cost` enumerates the options, copies the matching ShardingOption per table, gives it
the plan's shards (size, offset, rank) and its collectives' precision (qcomm codecs),
re-estimates, and reads `NoopPerfModel(topology).rate` (max over ranks of the shards' perf). It
also reads the same per-shard estimates as a synchronous step (Σ over perf parts: fwd compute,
fwd comms, bwd compute, bwd comms, prefetch, of the max over ranks), since each part ends in a
collective every rank waits for; the two readings differ only in the objective.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import torch

from sparselift import plans
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.optimizer.torchrec_baseline import ebc, planner_constraints, tr_topology
from sparselift.plans.baselines import quiet_torchrec as quiet


class _AllTypesSharder:
    """EmbeddingBagCollectionSharder that offers every sharding type and kernel on every device:
    row-wise and table-row-wise run on gloo CPU when the plan is built directly, so the referee must
    be able to score them there too."""

    def __new__(cls) -> Any:  # a factory: TorchRec is imported only when it is needed
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.types import ShardingType

        class Sharder(EmbeddingBagCollectionSharder):
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

            def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
                if sharding_type == ShardingType.DATA_PARALLEL.value:
                    return ["dense"]
                return (
                    ["fused", "fused_uvm_caching"] if compute_device_type == "cuda" else ["fused"]
                )

        return Sharder()


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
) -> tuple[Any, Any, Any, dict[tuple[str, str, str], Any]]:
    """(TorchRec topology, its estimator, the sharders' data it estimates with, the first enumerated
    ShardingOption per (table, type, kernel) with its per-shard perf already filled in)."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator

    trt = tr_topology(topo)
    cons = planner_constraints(stats, types, kernels)
    estimator = EmbeddingPerfEstimator(topology=trt, constraints=cons)
    enum = EmbeddingEnumerator(
        topology=trt, batch_size=batch_size, constraints=cons, estimator=[estimator]
    )
    by_key: dict[tuple[str, str, str], Any] = {}
    for o in enum.enumerate(ebc(stats), [_AllTypesSharder()]):
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


def torchrec_cost(
    plan_list: list[plans.Plan], stats: list[TableStats], topo: Topology, batch_size: int
) -> list[Verdict]:
    """TorchRec's EmbeddingPerfEstimator's verdict (ms) on each plan, both readings."""
    from torchrec.distributed.planner.perf_models import NoopPerfModel
    from torchrec.distributed.planner.types import Shard

    types: dict[str, list[str]] = {s.name: [] for s in stats}
    kernels: dict[str, list[str]] = {s.name: [] for s in stats}
    for p in plan_list:
        for t in p.tables:
            if t.sharding_type not in types[t.name]:
                types[t.name].append(t.sharding_type)
            if t.compute_kernel not in kernels[t.name]:
                kernels[t.name].append(t.compute_kernel)
    with quiet():
        trt, estimator, sharder_data, by_key = _estimated_options(
            stats, topo, batch_size, types, kernels
        )
        out = []
        for p in plan_list:
            chosen = []
            for t in p.tables:
                base = by_key[(t.name, t.sharding_type, t.compute_kernel)]
                o = copy.copy(base)
                o.shards = (
                    [
                        Shard(size=list(s.sizes), offset=list(s.offsets), rank=s.rank)
                        for s in t.shards
                    ]
                    if t.shards
                    else [
                        Shard(size=list(base.shards[0].size), offset=[0, 0], rank=r)
                        for r in t.ranks
                    ]
                )
                if t.cache_share is not None and o.cache_params is not None:
                    o.cache_params = copy.copy(o.cache_params)
                    o.cache_params.load_factor = t.cache_share
                chosen.append(o)
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
