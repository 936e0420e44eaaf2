"""The plan as dataclasses: what a SparseLift plan file says, and the verbs a trainer needs.

The file format is `plan.schema.json`; `to_dict`/`from_dict` are the only translation between the
two. The TorchRec side (`sharding_plan`, `sharders`, `apply`, …) lives in `to_torchrec.py` and is
imported on first use, so reading and checking a plan does not pay for importing torchrec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sparselift.plans.errors import PlanError

FORMAT = "sparselift-plan"
VERSION = 1
DEFAULT_CACHE_LOAD_FACTOR = 0.2  # the UVM cache size TorchRec and FBGEMM use when none is given


@dataclass(frozen=True)
class TableFingerprint:
    """One embedding table of the model the plan is for: what must match at load time."""

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple[str, ...]

    @classmethod
    def from_any(cls, t: TableFingerprint | dict[str, Any]) -> TableFingerprint:
        if isinstance(t, TableFingerprint):
            return t
        return cls(
            name=t["name"],
            num_embeddings=int(t["num_embeddings"]),
            embedding_dim=int(t["embedding_dim"]),
            feature_names=tuple(t.get("feature_names") or (t["name"],)),
        )


@dataclass(frozen=True)
class PlanTopology:
    world_size: int
    local_world_size: int
    device: str = "cpu"
    preset: str | None = None


@dataclass(frozen=True)
class Shard:
    """A block of a table: rows [offsets[0], +sizes[0]) × columns [offsets[1], +sizes[1]) on `rank`."""

    rank: int
    offsets: tuple[int, int]
    sizes: tuple[int, int]


@dataclass
class TablePlan:
    """Everything TorchRec's ParameterSharding needs for one table."""

    name: str
    sharding_type: str
    compute_kernel: str
    ranks: list[int]
    shards: list[Shard] = field(default_factory=list)  # empty for data_parallel
    cache_load_factor: float | None = None

    @property
    def cache_share(self) -> float | None:
        """The UVM cache's share of the table as it runs: TorchRec and FBGEMM size it at 0.2 when the
        plan names none (TorchRec's planner leaves it out by default)."""
        if self.compute_kernel == "fused_uvm_caching" and self.cache_load_factor is None:
            return DEFAULT_CACHE_LOAD_FACTOR
        return self.cache_load_factor


@dataclass
class CommPrecision:
    """qcomm precision of the sharded collectives, per direction."""

    forward: str = "fp32"
    backward: str = "fp32"


@dataclass
class Plan:
    model: list[TableFingerprint]
    topology: PlanTopology
    tables: list[TablePlan]
    comm_precision: CommPrecision = field(default_factory=CommPrecision)
    pipeline: str = "base"
    module: str | None = None  # FQN of the EmbeddingBagCollection in the train module, if known
    predicted: dict[str, Any] | None = None
    solver: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
    source: str = field(default="<plan>", compare=False)  # file it came from, for messages

    # ---------------------------------------------------------------------------- file format

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON object, keys in the documented order, tables in model order."""
        order = {t.name: i for i, t in enumerate(self.model)}
        tables = sorted(self.tables, key=lambda t: (order.get(t.name, len(order)), t.name))
        model: dict[str, Any] = {}
        if self.module is not None:
            model["module"] = self.module
        model["tables"] = [
            dict(
                name=t.name,
                num_embeddings=t.num_embeddings,
                embedding_dim=t.embedding_dim,
                feature_names=list(t.feature_names),
            )
            for t in self.model
        ]
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": model,
            "topology": dict(
                world_size=self.topology.world_size,
                local_world_size=self.topology.local_world_size,
                device=self.topology.device,
                preset=self.topology.preset,
            ),
            "tables": [_table_dict(t) for t in tables],
            "comm_precision": dict(
                forward=self.comm_precision.forward, backward=self.comm_precision.backward
            ),
            "pipeline": self.pipeline,
            "predicted": _canonical(self.predicted),
            "solver": _canonical(self.solver),
            "provenance": _canonical(self.provenance),
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = "<plan>") -> Plan:
        """Validate `d` (schema, then consistency) and build the plan; PlanError lists every problem."""
        from sparselift.plans.consistency import plan_problems
        from sparselift.plans.schema import schema_problems

        problems = schema_problems(d)
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
            source=source,
        )
        problems = plan_problems(plan)
        if problems:
            raise PlanError(source, problems)
        return plan

    def table(self, name: str) -> TablePlan:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    # ------------------------------------------------------------------------- fit to a model

    def check_spec(
        self, tables: list[dict[str, Any]] | list[TableFingerprint], world_size: int
    ) -> None:
        """Refuse (PlanError listing every difference) a model's tables or a world size it was not made for."""
        from sparselift.plans.consistency import fit_problems

        problems = fit_problems(self, [TableFingerprint.from_any(t) for t in tables], world_size)
        if problems:
            raise PlanError(self.source, problems)

    def check(self, model: Any, world_size: int) -> None:
        """`check_spec` against the EmbeddingBagCollections found in the unsharded `model`."""
        from sparselift.plans.to_torchrec import model_tables

        self.check_spec([t for _, t in model_tables(model)], world_size)

    # ------------------------------------------------------------------------------- TorchRec

    def sharding_plan(self, model: Any = None):
        """TorchRec's ShardingPlan; module paths from `model` if given, else the plan's `module`."""
        from sparselift.plans.to_torchrec import sharding_plan

        return sharding_plan(self, model)

    def sharders(self) -> list[Any]:
        from sparselift.plans.to_torchrec import sharders

        return sharders(self)

    def pipeline_class(self) -> type:
        from sparselift.plans.to_torchrec import pipeline_class

        return pipeline_class(self.pipeline)

    def apply(self, model: Any, pg: Any, device: Any):
        """Check the plan against `model` and the group, then shard it: a DistributedModelParallel."""
        from sparselift.plans.to_torchrec import apply

        return apply(self, model, pg, device)

    def plan_loader(self, model: Any = None):
        """A TorchRec PlanLoader serving this plan to `EmbeddingShardingPlanner(plan_loader=...)`."""
        from sparselift.plans.to_torchrec import SparseLiftPlanLoader

        return SparseLiftPlanLoader(self, model)


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
    """Free-form values with fixed float precision and sorted keys, so equal plans give equal bytes."""
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
