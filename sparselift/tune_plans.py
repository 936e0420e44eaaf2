"""The plan files `tune`'s loop writes and compares: the variants of a plan that a calibration
profiles side by side (pipelines, 16 bits, a table row-wise, small tables data-parallel), and
whether two plans choose alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparselift.atomic import write_json
from sparselift.plans.types import WEIGHT_BYTES


def same_sharding(a: str | Path, b: str | Path) -> bool:
    """Whether two plan files make the same choices (tables, splits, pipeline, comm precision),
    in whatever order they list their tables and splits (a kept profiled plan lists them as the
    model does, a solved one by name)."""

    def choices(path: str | Path) -> tuple[Any, ...]:
        p = json.loads(Path(path).read_text())
        by_name = {t["name"]: t for t in p.get("tables", [])}
        splits = {s["table"]: s for s in p.get("splits") or []}
        return by_name, splits, p.get("pipeline"), p.get("comm_precision")

    return choices(a) == choices(b)


def plan_variant(plan: str, work: Path, pipeline: str, sixteen_bit: bool = False) -> str:
    """`plan` under the train pipeline `pipeline`, and with its pooled collectives at fp16 both
    ways if `sixteen_bit` (what gloo and NCCL both run), written beside the loop's plans; its
    path. Why copies: the plans of a side-by-side job each carry their own pipeline and
    precision."""
    doc = json.loads(Path(plan).read_text())
    doc["pipeline"] = pipeline
    if sixteen_bit:
        doc["comm_precision"] = {"forward": "fp16", "backward": "fp16"}
    out = work / f"{Path(plan).stem}-{pipeline}{'-16bit' if sixteen_bit else ''}.json"
    write_json(out, doc)
    return str(out)


def calibration_plans(plan: str, work: Path, baseline: str) -> list[tuple[str, str]]:
    """The variants of `plan` a calibration profiles side by side, written beside the loop's
    plans, each with its profile directory's suffix: under the base ("") and the sparse-dist
    pipeline (the pair measures what the pipeline hides) and, for the `baseline` itself, at 16
    bits (what 16-bit collectives cost), with a table row-wise (what a reduce-scatter costs,
    `row_wise_variant`) and with its small tables data-parallel (what the dense TBE's
    backward, their gradient all-reduce and the trainer's optimizer pass over them cost,
    `data_parallel_variant`), where there are such; for any other plan, the baseline under the
    base pipeline ("-baseline"): the plan both jobs ran levels this job's speed with the first's
    (`analysis.job_levels`). Last, `plan` under the base pipeline again, as a model of its own
    ("-model-2"): the pipeline and 16 bits are then measured faster only against both models
    (`compare.spanning`)."""
    base = plan_variant(plan, work, "base")
    out = [(base, ""), (plan_variant(plan, work, "sparse-dist"), "-sparse-dist")]
    if plan != baseline:
        out.append((plan_variant(baseline, work, "base"), "-baseline"))
    else:
        out.append((plan_variant(plan, work, "base", True), "-16bit"))
        row_wise = row_wise_variant(plan, work)
        if row_wise is not None:
            out.append((row_wise, "-row-wise"))
        data_parallel = data_parallel_variant(plan, work)
        if data_parallel is not None:
            out.append((data_parallel, "-data-parallel"))
    return [*out, (base, "-model-2")]


def row_wise_variant(plan: str, work: Path) -> str | None:
    """`plan` with its largest table (rows × dim) that is not row-wise made row-wise over every
    rank (TorchRec's even row blocks), under the base pipeline, written beside the loop's plans;
    its path, or None where there is none to make (one rank, splits, every table row-wise).
    Why: a row-wise table's pooled output is a reduce-scatter, which a plan without one cannot
    price but by analogy; one profiled row-wise table measures it."""
    doc = json.loads(Path(plan).read_text())
    world = int(doc["topology"]["world_size"])
    size = {t["name"]: (t["num_embeddings"], t["embedding_dim"]) for t in doc["model"]["tables"]}
    others = [t for t in doc["tables"] if t["sharding_type"] != "row_wise" and t["name"] in size]
    if world < 2 or doc.get("splits") or not others:
        return None
    table = max(others, key=lambda t: size[t["name"]][0] * size[t["name"]][1])
    rows, dim = size[table["name"]]
    block = -(-rows // world)
    table.update(
        sharding_type="row_wise",
        ranks=list(range(world)),
        shards=[
            {
                "rank": r,
                "offsets": [r * block, 0],
                "sizes": [max(0, min(block, rows - r * block)), dim],
            }
            for r in range(world)
        ],
    )
    return _write_variant(doc, plan, work, "row-wise")


# the largest table (weights) `data_parallel_variant` replicates: the small tables TorchRec's
# planner makes data-parallel, whose all-reduce and whole-table optimizer pass cost little; and
# the most weights it replicates in all
DATA_PARALLEL_VARIANT_MAX_BYTES = 1 << 20
DATA_PARALLEL_VARIANT_TOTAL_BYTES = 4 << 20


def data_parallel_variant(plan: str, work: Path) -> str | None:
    """`plan` with its small tables made data-parallel on every rank: smallest first (rows ×
    dim), each of at most DATA_PARALLEL_VARIANT_MAX_BYTES of weights, as many as fit in
    DATA_PARALLEL_VARIANT_TOTAL_BYTES, at most all but one table; under the base pipeline,
    written beside the loop's plans. Its path, or None where there is none to make (one rank,
    splits, fewer than two tables, no table that small, or a table already data-parallel: its
    profile measures them).

    Why: data-parallel tables look up with the dense TBE, whose backward costs another multiple
    of the work than the fused kernels' (`OpFit.dense_scale`), their gradient is all-reduced and
    the trainer's optimizer passes over their weights; a plan without one prices all three by
    assumption. Small tables measure them at little cost to the profile job, and up to a few MiB
    of them replicate enough weights for the optimizer's pass to stand out of the steps' noise
    (`analysis.dense_backward.dense_optimizer_fit`)."""
    doc = json.loads(Path(plan).read_text())
    world = int(doc["topology"]["world_size"])
    size = {
        t["name"]: t["num_embeddings"]
        * t["embedding_dim"]
        * WEIGHT_BYTES[t.get("data_type") or "fp32"]
        for t in doc["model"]["tables"]
    }
    sharded = [t for t in doc["tables"] if t["name"] in size]
    if (
        world < 2
        or doc.get("splits")
        or len(sharded) < 2
        or any(t["sharding_type"] == "data_parallel" for t in doc["tables"])
    ):
        return None
    smallest = sorted(sharded, key=lambda t: (size[t["name"]], t["name"]))[:-1]
    chosen, total = [], 0
    for t in smallest:
        total += size[t["name"]]
        if size[t["name"]] > DATA_PARALLEL_VARIANT_MAX_BYTES or total > (
            DATA_PARALLEL_VARIANT_TOTAL_BYTES
        ):
            break
        chosen.append(t)
    if not chosen:
        return None
    for table in chosen:
        table.update(
            sharding_type="data_parallel",
            compute_kernel="dense",
            ranks=list(range(world)),
            shards=[],
            cache_load_factor=None,
        )
    return _write_variant(doc, plan, work, "data-parallel")


def _write_variant(doc: dict[str, Any], plan: str, work: Path, suffix: str) -> str:
    """`doc`, a variant of `plan`, under the base pipeline, written to work/<plan>-<suffix>.json;
    its path."""
    doc["pipeline"] = "base"
    out = work / f"{Path(plan).stem}-{suffix}.json"
    write_json(out, doc)
    return str(out)
