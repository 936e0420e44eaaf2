"""Plans used by the plan tests: built from the real `tiny` workload, no fakes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from sparselift import plans
from sparselift.plans import CommPrecision, PlanTopology, Shard, TablePlan
from sparselift.workloads.spec import load_workload

DLRM_EBC = "model.sparse_arch.embedding_bag_collection"


def tiny_tables(max_rows: int | None = None) -> list[dict[str, Any]]:
    return load_workload("tiny").capped(max_rows).fingerprints()


def round_robin(world: int = 2, max_rows: int | None = None) -> plans.Plan:
    return plans.round_robin_table_wise(
        tiny_tables(max_rows), PlanTopology(world, world, "cpu"), module=DLRM_EBC
    )


def mixed(precision: str = "fp32", pipeline: str = "base") -> plans.Plan:
    """Every sharding type TorchRec has, on 2 CPU ranks, for `tiny`."""
    p = round_robin(2)
    fp = {t.name: t for t in p.model}

    def rows(name: str) -> list[Shard]:
        r, d = fp[name].num_embeddings, fp[name].embedding_dim
        return [Shard(0, (0, 0), (r // 2, d)), Shard(1, (r // 2, 0), (r - r // 2, d))]

    def cols(name: str, ranks: list[int]) -> list[Shard]:
        r, d = fp[name].num_embeddings, fp[name].embedding_dim
        w = d // len(ranks)
        return [Shard(k, (0, i * w), (r, w)) for i, k in enumerate(ranks)]

    new = {
        "t0": TablePlan("t0", "data_parallel", "dense", [0, 1], []),
        "t2": TablePlan("t2", "row_wise", "fused", [0, 1], rows("t2")),
        "t3": TablePlan("t3", "column_wise", "fused", [1, 0], cols("t3", [1, 0])),
        "t4": TablePlan("t4", "table_row_wise", "fused", [0, 1], rows("t4")),
        "t5": TablePlan("t5", "table_column_wise", "fused", [1, 1], cols("t5", [1, 1])),
    }
    p.tables = [new.get(t.name, t) for t in p.tables]
    p.comm_precision = CommPrecision(precision, precision)
    p.pipeline = pipeline
    p.predicted = {
        "step_time_s": 0.0123456789012,
        "per_rank": [
            {"rank": 0, "compute_s": 0.001, "comm_s": 0.002, "memory_bytes": 1000},
            {"rank": 1, "compute_s": 0.003, "comm_s": 0.004, "memory_bytes": 2000},
        ],
    }
    p.solver = {
        "name": "test",
        "status": "OPTIMAL",
        "objective": 1.5,
        "bound": 1.25,
        "gap": 0.2,
        "time_s": 0.1,
        "seed": 0,
        "workers": 1,
    }
    p.provenance = {"z": 1, "a": {"y": 2.0, "b": [1, 2]}}
    return plans.Plan.from_dict(p.to_dict())


def write(path: Path, doc: Any) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def doc(plan: plans.Plan) -> dict[str, Any]:
    return copy.deepcopy(plan.to_dict())


def model_tables(plan: plans.Plan) -> list[dict[str, Any]]:
    """The plan's model tables as its file writes them (name, num_embeddings, embedding_dim,
    feature_names: EmbeddingBagConfig's keywords), fresh copies a test may change."""
    return doc(plan)["model"]["tables"]


def big_plan(n_tables: int = 1000, world: int = 8) -> plans.Plan:
    tables = [
        dict(
            name=f"table_{i:04d}",
            num_embeddings=1000 + i,
            embedding_dim=64,
            feature_names=[f"f_{i}"],
        )
        for i in range(n_tables)
    ]
    p = plans.round_robin_table_wise(tables, PlanTopology(world, world, "cpu"))
    for i, t in enumerate(p.tables):  # every third table row-wise: shards per rank
        if i % 3 == 0:
            r = 1000 + i
            step = -(-r // world)
            t.sharding_type, t.ranks = "row_wise", list(range(world))
            t.shards = [
                Shard(k, (min(k * step, r), 0), (max(0, min(step, r - k * step)), 64))
                for k in range(world)
            ]
    return p


def train_as_planned(path: Path, steps: int = 3) -> Any:
    """Train `tiny` on 2 gloo ranks with the plan file at `path`, check that every table of the
    plan (a split plan's virtual tables too) trained with its sharding type and ranks, and
    return the run's result."""
    from sparselift.workloads.harness import TrainConfig, run_training

    result = run_training(
        TrainConfig(
            workload="tiny",
            nproc=2,
            steps=steps,
            warmup=1,
            plan=str(path),
            hook="rank_hooks:ShardingTypes",
        )
    )
    got = result.ranks[0].extra["tables"]
    for t in plans.load(path).tables:
        assert got[t.name]["sharding_type"] == t.sharding_type, t.name
        assert got[t.name]["ranks"] == t.ranks, t.name
    return result
