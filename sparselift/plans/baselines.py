"""The two plans every SparseLift plan is measured against, in SparseLift's own format.

* `from_torchrec`: the plan TorchRec's EmbeddingShardingPlanner makes (run offline here with
  `torchrec_plan`, no process group needed), converted so that comparisons use one format.
* `round_robin_table_wise`: the DLRM reference layout — every table whole on one rank, round-robin
  in table order, base pipeline.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sparselift.plans.errors import PlanError
from sparselift.plans.plan import Plan
from sparselift.plans.types import CommPrecision, PlanTopology, Shard, TableFingerprint, TablePlan

# Named hardware for offline planning. The optimizer may define richer topology presets; these only
# say which device kind (and, optionally, memory per rank in bytes) TorchRec's planner assumes.
DEVICE_PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {"device": "cpu"},
    "cuda": {"device": "cuda"},
}


def from_torchrec(
    sharding_plan: Any,
    tables: list[TableFingerprint] | list[dict[str, Any]],
    topology: PlanTopology,
    *,
    pipeline: str = "base",
    provenance: dict[str, Any] | None = None,
) -> Plan:
    """Convert a TorchRec ShardingPlan for `tables` on `topology` into a validated Plan.

    Args:
        sharding_plan: TorchRec's ShardingPlan ({module path: {table: ParameterSharding}}).
        tables: the model's tables (fingerprints or plan-file table dicts).
        topology: the ranks it was planned for.
        pipeline: the train pipeline to record ("base" or "sparse-dist").
        provenance: free-form facts to record.
    Returns:
        The plan; its `module` is the one module path if there is exactly one, else None.
    Raises:
        PlanError: TorchRec's plan breaks a SparseLift check (every problem listed).
    """
    fingerprints = [TableFingerprint.from_any(t) for t in tables]
    out: list[TablePlan] = []
    modules = set()
    for path, module_plan in sharding_plan.plan.items():
        for name, ps in module_plan.items():
            modules.add(path)
            shards = []
            if ps.sharding_spec is not None:
                shards = [
                    Shard(
                        rank=int(md.placement.rank()),
                        offsets=tuple(md.shard_offsets),
                        sizes=tuple(md.shard_sizes),
                    )
                    for md in ps.sharding_spec.shards
                ]
            ranks = list(ps.ranks) if ps.ranks is not None else [s.rank for s in shards]
            load_factor = ps.cache_params.load_factor if ps.cache_params is not None else None
            out.append(
                TablePlan(
                    name=name,
                    sharding_type=ps.sharding_type,
                    compute_kernel=ps.compute_kernel,
                    ranks=ranks,
                    shards=shards,
                    cache_load_factor=load_factor,
                )
            )
    plan = Plan(
        model=fingerprints,
        topology=topology,
        tables=out,
        comm_precision=CommPrecision(),
        pipeline=pipeline,
        module=next(iter(modules)) if len(modules) == 1 else None,
        solver={"name": "torchrec.EmbeddingShardingPlanner"},
        provenance=provenance,
        source="<torchrec plan>",
    )
    return Plan.from_dict(plan.to_dict(), plan.source)  # a TorchRec plan must pass our checks too


def round_robin_table_wise(
    tables: list[TableFingerprint] | list[dict[str, Any]],
    topology: PlanTopology,
    *,
    module: str | None = None,
    provenance: dict[str, Any] | None = None,
) -> Plan:
    """The DLRM reference plan: table i whole on rank i mod world_size.

    Fused kernel, fp32 collectives, base pipeline.

    Args:
        tables: the model's tables, in model order.
        topology: the ranks.
        module: the EmbeddingBagCollection's path, if known.
        provenance: free-form facts to record.
    Raises:
        PlanError: the plan breaks a check (e.g. a CPU-only kernel on a device that lacks it).
    """
    fingerprints = [TableFingerprint.from_any(t) for t in tables]
    out = [
        TablePlan(
            name=t.name,
            sharding_type="table_wise",
            compute_kernel="fused",
            ranks=[i % topology.world_size],
            shards=[
                Shard(
                    rank=i % topology.world_size,
                    offsets=(0, 0),
                    sizes=(t.num_embeddings, t.embedding_dim),
                )
            ],
        )
        for i, t in enumerate(fingerprints)
    ]
    plan = Plan(
        model=fingerprints,
        topology=topology,
        tables=out,
        pipeline="base",
        module=module,
        solver={"name": "round-robin-table-wise"},
        provenance=provenance,
        source="<round-robin plan>",
    )
    return Plan.from_dict(plan.to_dict(), plan.source)


def torchrec_plan(
    model: Any,
    topology: PlanTopology,
    batch_size: int,
    sharders: list[Any] | None = None,
    *,
    tr_topology: Any = None,
    constraints: dict[str, Any] | None = None,
    timeout_seconds: int | None = None,
) -> Any:
    """Run TorchRec's EmbeddingShardingPlanner offline (rank 0's view) for `model` on `topology`.

    Args:
        model: the unsharded model (tables on `meta` are fine).
        topology: the ranks; its device (or preset) picks TorchRec's device kind and memory.
        batch_size: samples per rank.
        sharders: TorchRec sharders (default: TorchRec's own, one per kind of collection:
            `to_torchrec.default_sharders`).
        tr_topology: a TorchRec Topology with memory and bandwidths, instead of one built from
            `topology`.
        constraints: TorchRec ParameterConstraints per table.
        timeout_seconds: the planner's time limit.
        Without the last three the planner runs as a trainer calls it.
    Returns:
        TorchRec's ShardingPlan.
    Raises:
        PlanError: the planner found no plan (e.g. the tables do not fit the topology's memory).
    """
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    from sparselift.plans.to_torchrec import default_sharders

    with quiet_torchrec():  # a Topology built directly logs a warning the user cannot act on
        if tr_topology is None:
            preset = DEVICE_PRESETS.get(topology.preset or topology.device, {})
            extra = {k: preset[k] for k in ("hbm_cap", "ddr_cap") if k in preset}
            tr_topology = Topology(
                world_size=topology.world_size,
                compute_device=topology.device,
                local_world_size=topology.local_world_size,
                **extra,
            )
        planner = EmbeddingShardingPlanner(
            topology=tr_topology,
            batch_size=batch_size,
            constraints=constraints,
            timeout_seconds=timeout_seconds,
        )
        try:
            return planner.plan(model, sharders or default_sharders())
        except Exception as e:  # PlannerError: e.g. the tables do not fit the topology's memory
            if type(e).__name__ == "PlannerError":
                raise PlanError("torchrec planner", str(e).strip().splitlines()[0]) from None
            raise


@contextmanager
def quiet_torchrec() -> Iterator[None]:
    """Mute TorchRec's planner while it runs: warnings to the root logger, FutureWarnings.

    The planner logs a warning for every data-parallel table, which a user cannot act on.
    """
    loggers = [logging.getLogger(), logging.getLogger("torchrec")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
