"""TorchRec as the baseline and the referee.

* `torchrec_plan`: the plan TorchRec's EmbeddingShardingPlanner makes for the same tables, statistics
  (pooling factors) and topology (memory, bandwidths), offline, converted to a SparseLift plan with
  `sparselift.plans.from_torchrec`. Its planner is slow on large models, so `torchrec_plan_timed`
  runs it in a forked child under a hard timeout.
* `torchrec_cost`: TorchRec's own EmbeddingPerfEstimator's verdict on *any* plan: enumerate the
  options, copy the matching ShardingOption per table, give it the plan's shards (size, offset,
  rank) and its collectives' precision (qcomm codecs), re-estimate, and
  `NoopPerfModel(topology).rate` (max over ranks of the shards' perf). Also
  the same per-shard estimates read as a synchronous step — Σ over perf parts (fwd compute, fwd
  comms, bwd compute, bwd comms, prefetch) of the max over ranks — since each part ends in a
  collective every rank waits for; the two readings differ only in the objective.
"""

from __future__ import annotations

import copy
import dataclasses
import multiprocessing as mp
import time
from typing import Any, NamedTuple

import torch

from sparselift import plans
from sparselift.optimizer.planio import fingerprints, plan_topology
from sparselift.optimizer.stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.plans.baselines import quiet_torchrec as quiet


def tr_topology(topo: Topology):
    """TorchRec's Topology for ours (its bandwidths are bytes/ms)."""
    from torchrec.distributed.planner import Topology as TRTopology

    kw: dict[str, Any] = dict(
        world_size=topo.world_size,
        compute_device=topo.device,
        local_world_size=topo.local_world_size,
        ddr_cap=topo.ddr_bytes,
        intra_host_bw=topo.intra_host_bw / 1e3,
        inter_host_bw=topo.inter_host_bw / 1e3,
    )
    if topo.device == "cuda":
        kw.update(hbm_cap=topo.hbm_bytes, hbm_mem_bw=topo.lookup_rate * 4 / 0.4 / 1e3)
        if topo.hbm_to_ddr_bw:
            kw.update(hbm_to_ddr_mem_bw=topo.hbm_to_ddr_bw / 1e3)
    return TRTopology(**kw)


def ebc(stats: list[TableStats]):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=s.name,
                embedding_dim=s.embedding_dim,
                num_embeddings=s.num_embeddings,
                feature_names=list(s.feature_names or (s.name,)),
            )
            for s in stats
        ],
        device=torch.device("meta"),
    )


def _constraints(
    stats: list[TableStats],
    types: dict[str, list[str]] | None = None,
    kernels: dict[str, list[str]] | None = None,
):
    from torchrec.distributed.planner.types import ParameterConstraints

    out = {}
    for s in stats:
        nf = max(1, len(s.feature_names))
        kw: dict[str, Any] = dict(pooling_factors=[s.ids_per_sample / nf] * nf)
        if types:
            kw["sharding_types"] = types[s.name]
        if kernels:
            kw["compute_kernels"] = kernels[s.name]
        out[s.name] = ParameterConstraints(**kw)
    return out


class _AllTypesSharder:
    """EmbeddingBagCollectionSharder that offers every sharding type and kernel on every device:
    row-wise and table-row-wise run on gloo CPU when the plan is built directly, so the referee must
    be able to score them there too."""

    def __new__(cls):
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


def torchrec_plan(
    stats: list[TableStats],
    topo: Topology,
    batch_size: int,
    timeout_s: int | None = None,
    informed: bool = True,
    comm_precision: plans.CommPrecision | None = None,
) -> plans.Plan:
    """TorchRec's EmbeddingShardingPlanner on these tables and this topology, as a SparseLift plan.

    `informed`: given the tables' pooling factors and our topology's memory and bandwidths; else the
    planner as a trainer calls it by default (device, world size, nothing else), which is the plan
    `sparselift train` uses without `--plan`. `comm_precision`: the planner plans for collectives
    at that precision (a sharder with those qcomm codecs, as a user who enables them would give it)
    and the plan keeps it; by default fp32, TorchRec's default.
    """
    from sparselift.plans.to_torchrec import precision_sharders

    ptopo = plan_topology(topo)
    sh = None if comm_precision is None else precision_sharders(comm_precision, torch.device("cpu"))
    sp = plans.torchrec_plan(
        ebc(stats),
        ptopo,
        batch_size,
        sh,
        tr_topology=tr_topology(topo) if informed else None,
        constraints=_constraints(stats) if informed else None,
        timeout_seconds=timeout_s,
    )
    p = plans.from_torchrec(
        sp, fingerprints(stats), ptopo, provenance={"planner": "torchrec.EmbeddingShardingPlanner"}
    )
    return p if comm_precision is None else dataclasses.replace(p, comm_precision=comm_precision)


def _child(q, stats, topo, batch_size, timeout_s, informed, comm_precision) -> None:
    try:
        t0 = time.perf_counter()
        p = torchrec_plan(stats, topo, batch_size, timeout_s, informed, comm_precision)
        q.put(("ok", p.to_dict(), time.perf_counter() - t0))
    except Exception as e:  # noqa: BLE001 - reported to the parent as text
        q.put(("error", f"{type(e).__name__}: {e}", 0.0))


def torchrec_plan_timed(
    stats: list[TableStats],
    topo: Topology,
    batch_size: int,
    timeout_s: float,
    informed: bool = True,
    comm_precision: plans.CommPrecision | None = None,
) -> tuple[plans.Plan | None, float, str]:
    """(plan or None, seconds, status: ok | timeout | error text) with a hard wall-clock limit."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    t0 = time.perf_counter()
    proc = ctx.Process(
        target=_child,
        args=(q, stats, topo, batch_size, max(1, int(timeout_s)), informed, comm_precision),
        daemon=True,
    )
    proc.start()
    try:
        status, payload, secs = q.get(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - queue.Empty: the planner is still running
        proc.kill()
        proc.join()
        return None, time.perf_counter() - t0, "timeout"
    proc.join()
    if status != "ok":
        return None, time.perf_counter() - t0, payload
    return plans.Plan.from_dict(payload, "<torchrec plan>"), secs, "ok"


class Verdict(NamedTuple):
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
    cons = _constraints(stats, types, kernels)
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
    """TorchRec's per-shard estimate (ms, by perf part) of each table as one shard of `sharding_type`:
    what its referee charges a table, to set beside SparseLift's own terms."""
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
    collectives by the sharder's qcomm codecs, which the plan's comm precision sets, as the loader does."""
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
