"""The translation between a `Plan` and the plan file's JSON object (`plan.schema.json`).

`plan_to_dict` and `plan_from_dict` (behind `Plan.to_dict` / `Plan.from_dict`) are the only
translation between the two, and `plan_from_dict` is the one place a plan is validated (schema,
then consistency). Free-form values are made canonical on the way out, so that equal plans give
equal bytes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sparselift.plans.consistency import plan_problems
from sparselift.plans.digest import statistics_problems
from sparselift.plans.errors import PlanError
from sparselift.plans.schema import schema_problems
from sparselift.plans.splits import split_from_dict, split_to_dict
from sparselift.plans.types import (
    FORMAT,
    VERSION,
    VERSION_WITHOUT_SPLITS,
    CommPrecision,
    PlanTopology,
    Shard,
    Split,
    TableFingerprint,
    TablePlan,
)

if TYPE_CHECKING:  # `plan.py` calls these; importing it here would close a circle
    from sparselift.plans.plan import Plan


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan file's JSON object of `plan`: keys in the documented order, tables in model order
    (a split table's parts in its place, in part order).

    Free-form values (`predicted`, `solver`, `provenance`, cache_load_factor) are made
    canonical — sorted keys, floats to 10 significant digits, non-finite floats as null — so
    that equal plans give equal bytes.
    """
    order = {t.name: i for i, t in enumerate(plan.sharded_tables())}
    tables = sorted(plan.tables, key=lambda t: (order.get(t.name, len(order)), t.name))
    model: dict[str, Any] = {}
    if plan.module is not None:
        model["module"] = plan.module
    model["tables"] = [
        dict(
            name=t.name,
            num_embeddings=t.num_embeddings,
            embedding_dim=t.embedding_dim,
            feature_names=list(t.feature_names),
            **({"sequence": True} if t.sequence else {}),
            **({"module": t.module} if t.module is not None else {}),
            **({"data_type": t.data_type} if t.data_type != "fp32" else {}),
        )
        for t in plan.model
    ]
    out: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION if plan.splits else VERSION_WITHOUT_SPLITS,
        "model": model,
        "topology": dict(
            world_size=plan.topology.world_size,
            local_world_size=plan.topology.local_world_size,
            device=plan.topology.device,
            preset=plan.topology.preset,
        ),
    }
    if plan.splits:
        out["splits"] = [split_to_dict(s) for s in plan.splits]
    out |= {
        "tables": [_table_dict(t) for t in tables],
        "comm_precision": dict(
            forward=plan.comm_precision.forward, backward=plan.comm_precision.backward
        ),
        "pipeline": plan.pipeline,
        "predicted": _canonical(plan.predicted),
        "solver": _canonical(plan.solver),
        "provenance": _canonical(plan.provenance),
    }
    if plan.evidence is not None:
        out["evidence"] = _canonical(plan.evidence)
    if plan.statistics is not None:
        out["statistics"] = _canonical(plan.statistics)
    return out


def plan_from_dict(cls: type[Plan], d: Any, source: str = "<plan>") -> Plan:
    """Validate a decoded plan file (schema, then consistency) and build the plan.

    Args:
        cls: the class to build (`Plan` or a subclass).
        d: the decoded JSON document.
        source: where it came from, named in every message.
    Returns:
        The plan, integers as Python ints (JSON Schema counts 2.0 as an integer).
    Raises:
        PlanError: listing every problem found (not only the first).
    """
    problems = schema_problems(d)
    if problems:
        raise PlanError(source, problems)
    splits: list[Split] = []
    for i, sd in enumerate(d.get("splits", [])):
        split, bad = split_from_dict(sd, i)
        splits.append(split)
        problems += bad
    if splits and d["version"] < VERSION:
        problems.append(f"splits need plan format version {VERSION}, not {d['version']}")
    if problems:
        raise PlanError(source, problems)
    m = d["model"]
    topo = d["topology"]
    plan = cls(
        model=[TableFingerprint.from_any(t) for t in m["tables"]],
        module=m.get("module"),
        # int(): JSON Schema counts 2.0 as an integer; TorchRec needs real ints.
        topology=PlanTopology(
            world_size=int(topo["world_size"]),
            local_world_size=int(topo["local_world_size"]),
            device=topo["device"],
            preset=topo.get("preset"),
        ),
        tables=[
            TablePlan(
                name=t["name"],
                sharding_type=t["sharding_type"],
                compute_kernel=t["compute_kernel"],
                ranks=[int(r) for r in t["ranks"]],
                shards=[
                    Shard(
                        rank=int(s["rank"]),
                        offsets=(int(s["offsets"][0]), int(s["offsets"][1])),
                        sizes=(int(s["sizes"][0]), int(s["sizes"][1])),
                    )
                    for s in t["shards"]
                ],
                cache_load_factor=t.get("cache_load_factor"),
            )
            for t in d["tables"]
        ],
        comm_precision=CommPrecision(**d["comm_precision"]),
        pipeline=d["pipeline"],
        predicted=d.get("predicted"),
        solver=d.get("solver"),
        provenance=d.get("provenance"),
        evidence=d.get("evidence"),
        statistics=d.get("statistics"),
        splits=splits,
        source=source,
    )
    problems = plan_problems(plan) + statistics_problems(plan)
    if problems:
        raise PlanError(source, problems)
    return plan


def _table_dict(t: TablePlan) -> dict[str, Any]:
    return {
        "name": t.name,
        "sharding_type": t.sharding_type,
        "compute_kernel": t.compute_kernel,
        "ranks": list(t.ranks),
        "shards": [
            dict(rank=s.rank, offsets=list(s.offsets), sizes=list(s.sizes)) for s in t.shards
        ],
        "cache_load_factor": _canonical(t.cache_load_factor),
    }


def _canonical(v: Any) -> Any:
    """A free-form value with fixed float precision and sorted keys: equal plans, equal bytes."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        return float(f"{v:.10g}")
    if isinstance(v, dict):
        return {str(k): _canonical(v[k]) for k in sorted(v, key=str)}
    if isinstance(v, (list, tuple)):
        return [_canonical(x) for x in v]
    return str(v)
