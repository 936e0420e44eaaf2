"""Rules the schema cannot express: ranks in range, shards tiling tables, kernels TorchRec offers.

`plan_problems` checks a plan on its own; `fit_problems` checks it against a model's tables and the
running world size. Both return every problem found (never stop at the first), each naming the
table.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from sparselift.plans.splits import sharded_tables, split_fit_problems, split_problems
from sparselift.plans.types import (
    MAX_EMBEDDING_DIM,
    MAX_NUM_EMBEDDINGS,
    MAX_WORLD_SIZE,
    TableFingerprint,
    TablePlan,
)

if TYPE_CHECKING:  # `plan.py` calls these checks; importing it here would close a circle
    from sparselift.plans.plan import Plan

# What EmbeddingBagCollectionSharder.compute_kernels offers per device, for model-parallel tables.
MP_KERNELS = {"cpu": ("fused",), "cuda": ("fused", "fused_uvm", "fused_uvm_caching", "key_value")}
# What EmbeddingCollectionSharder.sharding_types offers (an EmbeddingCollection's tables).
SEQUENCE_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise")


def plan_problems(plan: Plan) -> list[str]:
    """Every problem of `plan` on its own: topology, table names and features, splits, each
    table's shards (a split table's parts against the shapes the split gives them).

    Returns:
        One message per problem, each naming the table it is about; [] for a consistent plan.
    """
    problems: list[str] = []
    topo = plan.topology
    if topo.world_size > MAX_WORLD_SIZE:  # before any check that walks the ranks
        return [f"topology: world_size {topo.world_size:,} is more than {MAX_WORLD_SIZE:,}"]
    problems += _size_problems(plan.model)
    if topo.local_world_size > topo.world_size or topo.world_size % topo.local_world_size:
        problems.append(
            f"topology: local_world_size {topo.local_world_size} does not divide "
            f"world_size {topo.world_size}"
        )
    bad_splits = split_problems(plan.splits, plan.model)
    problems += bad_splits
    sharded = sharded_tables(plan.model, plan.splits)
    problems += _name_problems(plan, sharded)
    # parts of a broken split have no shapes to check shards against
    unsized = {p for s in plan.splits for p in s.parts} if bad_splits else set()
    fingerprints = {t.name: t for t in sharded if t.name not in unsized}
    for t in plan.tables:
        fp = fingerprints.get(t.name)
        if fp is not None:
            problems += [f"table {t.name!r}: {p}" for p in table_problems(t, fp, plan)]
    return problems


def _size_problems(tables: list[TableFingerprint]) -> list[str]:
    """Tables beyond the largest a plan describes (MAX_NUM_EMBEDDINGS × MAX_EMBEDDING_DIM)."""
    problems = []
    for t in tables:
        if t.num_embeddings > MAX_NUM_EMBEDDINGS:
            problems.append(
                f"model.tables: table {t.name!r} has {t.num_embeddings:,} rows, "
                f"more than {MAX_NUM_EMBEDDINGS:,}"
            )
        if t.embedding_dim > MAX_EMBEDDING_DIM:
            problems.append(
                f"model.tables: table {t.name!r} has dim {t.embedding_dim:,}, "
                f"more than {MAX_EMBEDDING_DIM:,}"
            )
    return problems


def _name_problems(plan: Plan, sharded: list[TableFingerprint]) -> list[str]:
    """Duplicate names, features feeding two tables, and `tables` against the tables as
    sharded (`sharded`: the model's, split tables replaced by their parts)."""
    problems = []
    model_names = [t.name for t in plan.model]
    plan_names = [t.name for t in plan.tables]
    for what, names in (("model.tables", model_names), ("tables", plan_names)):
        dup = (
            sorted({n for n in names if names.count(n) > 1})
            if len(set(names)) != len(names)
            else []
        )
        problems += [f"{what}: table {n!r} appears more than once" for n in dup]
    features: dict[str, str] = {}
    for t in plan.model:
        for f in t.feature_names:
            if f in features and features[f] != t.name:
                problems.append(
                    f"model.tables: feature {f!r} feeds both {features[f]!r} and {t.name!r}"
                )
            features[f] = t.name
    parts = {p: s.table for s in plan.splits for p in s.parts}
    split = {s.table: s for s in plan.splits}
    plan_set, sharded_set = set(plan_names), {t.name for t in sharded}
    for n in (t.name for t in sharded):
        if n in plan_set:
            continue
        if n in parts:
            problems.append(f"part {n!r} of split table {parts[n]!r} has no entry in tables")
        else:
            problems.append(f"table {n!r} of the model has no entry in tables")
    for n in plan_names:
        if n in sharded_set:
            continue
        if n in split:
            problems.append(
                f"tables: {n!r} is split into virtual tables ({', '.join(split[n].parts)}); "
                f"they have entries, not the table"
            )
        else:
            problems.append(f"tables: {n!r} is not a table of the model")
    return problems


def table_problems(t: TablePlan, fp: TableFingerprint, plan: Plan) -> list[str]:
    """Problems of one table's sharding against its size and the plan's topology.

    Args:
        t: the table's sharding.
        fp: the table as the plan's model declares it.
        plan: the plan (for its topology).
    Returns:
        One message per problem, without the table's name (the caller adds it).
    """
    world, local = plan.topology.world_size, plan.topology.local_world_size
    device = plan.topology.device
    problems = [
        f"rank {r} is out of range for world_size {world}"
        for r in sorted(set(t.ranks))
        if r >= world
    ]
    problems += [
        f"shard rank {s.rank} is out of range for world_size {world}"
        for s in t.shards
        if s.rank >= world
    ]
    if fp.sequence and t.sharding_type not in SEQUENCE_TYPES:
        problems.append(
            f"{t.sharding_type} is not offered for an EmbeddingCollection's table "
            f"(use one of {', '.join(SEQUENCE_TYPES)})"
        )
    if t.sharding_type == "data_parallel":
        if t.compute_kernel != "dense":
            problems.append(f"data_parallel needs compute_kernel 'dense', got {t.compute_kernel!r}")
        if t.shards:
            problems.append(
                "data_parallel tables have no shards (every rank holds the whole table)"
            )
        if sorted(t.ranks) != list(range(world)):
            problems.append(f"data_parallel ranks must be every rank 0..{world - 1}, got {t.ranks}")
    else:
        allowed = MP_KERNELS.get(device, ())
        if t.compute_kernel not in allowed:
            problems.append(
                f"compute_kernel {t.compute_kernel!r} is not offered for {t.sharding_type} on "
                f"{device} (use one of {', '.join(allowed)})"
            )
        if not t.shards:
            problems.append(f"{t.sharding_type} needs shards")
        elif t.ranks != [s.rank for s in t.shards]:
            problems.append(
                f"ranks {t.ranks} do not match the shards' ranks {[s.rank for s in t.shards]}"
            )
        problems += _shape_problems(t, fp, world, local)
    if t.cache_load_factor is not None and t.compute_kernel != "fused_uvm_caching":
        problems.append(
            f"cache_load_factor is only for compute_kernel 'fused_uvm_caching', "
            f"not {t.compute_kernel!r}"
        )
    return problems


def _shape_problems(t: TablePlan, fp: TableFingerprint, world: int, local: int) -> list[str]:
    rows, dim = fp.num_embeddings, fp.embedding_dim
    shards = t.shards
    if not shards:
        return []
    problems = []
    for i, s in enumerate(shards):
        (r0, c0), (nr, nc) = s.offsets, s.sizes
        if r0 + nr > rows or c0 + nc > dim:
            problems.append(
                f"shard {i} rows {r0}..{r0 + nr} × columns {c0}..{c0 + nc} exceeds the table "
                f"({rows} × {dim})"
            )
        if nc == 0:
            problems.append(f"shard {i} has no columns")
        elif nc % 4:
            problems.append(
                f"shard {i} has {nc} columns: FBGEMM's kernels need a multiple of 4 "
                "(TorchRec would refuse it when sharding)"
            )
    kind = t.sharding_type
    if kind == "table_wise":
        if (
            len(shards) != 1
            or tuple(shards[0].offsets) != (0, 0)
            or tuple(shards[0].sizes) != (rows, dim)
        ):
            problems.append(f"table_wise needs one shard of the whole table ({rows} × {dim})")
        return problems
    if kind in ("row_wise", "table_row_wise"):
        problems += [
            f"shard {i} must span all {dim} columns for {kind}"
            for i, s in enumerate(shards)
            if s.offsets[1] != 0 or s.sizes[1] != dim
        ]
        problems += _tiling(kind, "rows", [(s.offsets[0], s.sizes[0]) for s in shards], rows)
        if kind == "row_wise" and t.ranks != list(range(world)):
            problems.append(
                f"row_wise needs one shard per rank in rank order 0..{world - 1}, "
                f"got ranks {t.ranks}"
            )
        if kind == "table_row_wise":
            host = t.ranks[0] // local if t.ranks else 0
            expected = list(range(host * local, host * local + local))
            if t.ranks != expected:
                problems.append(
                    f"table_row_wise needs one shard per rank of one host in rank order "
                    f"(e.g. {expected}), got ranks {t.ranks}"
                )
        return problems
    # column_wise, table_column_wise
    problems += [
        f"shard {i} must span all {rows} rows for {kind}"
        for i, s in enumerate(shards)
        if s.offsets[0] != 0 or s.sizes[0] != rows
    ]
    problems += _tiling(kind, "columns", [(s.offsets[1], s.sizes[1]) for s in shards], dim)
    return problems


def _tiling(kind: str, axis: str, spans: list[tuple[int, int]], total: int) -> list[str]:
    """Spans (offset, size), in shard order, must tile [0, total) without gap or overlap."""
    at = 0
    for i, (off, size) in enumerate(spans):
        if off != at:
            what = (
                "overlaps the previous shard"
                if off < at
                else f"leaves {axis} {at}..{off} uncovered"
            )
            return [
                f"{kind} shards must cover {axis} 0..{total} in order: "
                f"shard {i} starts at {off}, {what}"
            ]
        at = off + size
    if at != total:
        return [f"{kind} shards cover {axis} 0..{at} but the table has {total} {axis}"]
    return []


def fit_problems(plan: Plan, tables: list[TableFingerprint], world_size: int) -> list[str]:
    """Differences between the plan's model and world size and those it is about to run with.

    A split table is held to what its split needs: its features, and rows and columns that its
    ranges or hot ids fit (each message names the part and the range out of reach).

    Args:
        plan: the plan.
        tables: the model's tables as it is built.
        world_size: the ranks of the job.
    Returns:
        One message per difference, naming the table; [] if the plan fits.
    """
    problems = []
    if plan.topology.world_size != world_size:
        problems.append(
            f"plan is for world_size {plan.topology.world_size}, this job has {world_size} ranks"
        )
    planned = {t.name: t for t in plan.model}
    actual = {t.name: t for t in tables}
    if planned and actual and planned.keys().isdisjoint(actual):
        return problems + [
            f"the plan is for another model: none of its {len(planned)} tables "
            f"({_some(planned)}) is in the model, whose {len(actual)} tables are {_some(actual)}"
        ]
    problems += [
        f"table {n!r} is in the model but not in the plan" for n in actual if n not in planned
    ]
    problems += [
        f"table {n!r} is in the plan but not in the model" for n in planned if n not in actual
    ]
    splits = {s.table: s for s in plan.splits}
    for name, a in actual.items():
        p = planned.get(name)
        if p is None:
            continue
        if p.sequence != a.sequence:
            kinds = ("an EmbeddingBagCollection's", "an EmbeddingCollection's")
            problems.append(
                f"table {name!r} is {kinds[a.sequence]} in the model, {kinds[p.sequence]} in "
                "the plan"
            )
        if p.data_type != a.data_type:
            problems.append(
                f"table {name!r} holds {a.data_type} weights in the model, {p.data_type} in the "
                "plan (its memory was counted in those): plan it again"
            )
        if name in splits:
            problems += split_fit_problems(splits[name], p, a)
            continue
        if p.num_embeddings != a.num_embeddings:
            problems.append(
                f"table {name!r} has {a.num_embeddings} rows in the model, "
                f"{p.num_embeddings} in the plan"
            )
        if p.embedding_dim != a.embedding_dim:
            problems.append(
                f"table {name!r} has dim {a.embedding_dim} in the model, "
                f"{p.embedding_dim} in the plan"
            )
        if tuple(p.feature_names) != tuple(a.feature_names):
            problems.append(
                f"table {name!r} is fed features {list(a.feature_names)} in the model, "
                f"{list(p.feature_names)} in the plan"
            )
    return problems


def _some(names: Collection[str], shown: int = 4) -> str:
    """The first `shown` of `names`, quoted, and "…" if there are more."""
    first = ", ".join(repr(n) for n in list(names)[:shown])
    return first if len(names) <= shown else f"{first}, …"
