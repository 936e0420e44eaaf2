"""Between the optimizer's choices and `sparselift.plans.Plan` (the plan file), both ways.

Shards follow TorchRec's own layouts (row blocks of ceil(rows / n), equal column blocks) so that a
plan the optimizer writes is the sharding TorchRec would construct for that option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sparselift import plans
from sparselift.errors import UserError
from sparselift.optimizer.space import CW, DP, RW, TW, TWRW, Choice, OptionClass, PlanWide
from sparselift.optimizer.split_options import SplitOption
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology

# A digest value keeps this many significant digits: the same inputs give the same plan bytes,
# and a digest read back compares equal to one computed again from the same profile.
DIGEST_DIGITS = 6
HOT_FRACTION = 0.01  # the digest's hot share: of the hottest 1 % of a table's rows


def _digits(v: float) -> float:
    return float(f"{v:.{DIGEST_DIGITS}g}")


def statistics_digest(stats: list[TableStats], batch_size: int) -> dict[str, dict[str, float]]:
    """The plan's `statistics` block: per table, what the cost model priced it with.

    Fields (each rounded to DIGEST_DIGITS significant digits):
        ids_per_step: ids one rank looks up in the table per step, all its features summed
            (ids per sample x the batch per rank).
        unique_ratio: distinct rows among those ids over the ids, as the cost model counts them
            (`TableStats.unique`: its Zipf law, past the hot rows for a cold part); 0 for no ids.
        pooling: mean ids per sample of one of its features (ids per sample / features).
        hot_share: share of the ids on the hottest 1 % of its rows (`TableStats.hot_share`:
            measured where the profile measured it, else the Zipf law's).

    Args:
        stats: the tables.
        batch_size: samples per rank.
    Returns:
        {table: {field: value}}, tables in the order given.
    """
    out: dict[str, dict[str, float]] = {}
    for t in stats:
        ids = t.ids_per_sample * batch_size
        unique = t.unique(ids) / ids if ids > 0 else 0.0
        out[t.name] = {
            "ids_per_step": _digits(ids),
            "unique_ratio": _digits(min(1.0, unique)),
            "pooling": _digits(t.ids_per_sample / max(1, len(t.feature_names))),
            "hot_share": _digits(min(1.0, max(0.0, t.hot_share(HOT_FRACTION)))),
        }
    return out


def _row_blocks(rows: int, ranks: list[int], dim: int) -> list[plans.Shard]:
    block = -(-rows // len(ranks))
    out = []
    for i, r in enumerate(ranks):
        lo = min(rows, i * block)
        out.append(plans.Shard(rank=r, offsets=(lo, 0), sizes=(min(rows, lo + block) - lo, dim)))
    return out


def table_plan(t: TableStats, ch: Choice, topo: Topology) -> plans.TablePlan:
    """Table `t` under choice `ch` as the plan file's table entry, with TorchRec's shard layout."""
    c, n, d = ch.cls, t.num_embeddings, t.embedding_dim
    ranks = ch.plan_ranks(topo)
    if c.sharding_type == DP:
        shards: list[plans.Shard] = []
    elif c.sharding_type == TW:
        shards = [plans.Shard(rank=ranks[0], offsets=(0, 0), sizes=(n, d))]
    elif c.sharding_type == CW:
        cols = d // c.shards
        shards = [
            plans.Shard(rank=r, offsets=(0, i * cols), sizes=(n, cols)) for i, r in enumerate(ranks)
        ]
    else:  # RW, TWRW
        shards = _row_blocks(n, ranks, d)
    return plans.TablePlan(
        name=t.name,
        sharding_type=c.sharding_type,
        compute_kernel=c.kernel,
        ranks=ranks,
        shards=shards,
        cache_load_factor=c.cache_load_factor,
    )


def fingerprints(stats: list[TableStats]) -> list[plans.TableFingerprint]:
    """The tables as a plan's model fingerprint (name, rows, dim, features, sequence, weight
    type and, where profiled, collection)."""
    return [
        plans.TableFingerprint(
            name=t.name,
            num_embeddings=t.num_embeddings,
            embedding_dim=t.embedding_dim,
            feature_names=tuple(t.feature_names or (t.name,)),
            sequence=t.sequence,
            module=t.collection,
            data_type=t.data_type,
        )
        for t in stats
    ]


def plan_topology(topo: Topology) -> plans.PlanTopology:
    """The part of our topology a plan file records (ranks, hosts, device, preset)."""
    return plans.PlanTopology(
        world_size=topo.world_size,
        local_world_size=topo.local_world_size,
        device=topo.device,
        preset=topo.preset,
    )


def to_plan(
    stats: list[TableStats],
    choices: Mapping[str, Choice],
    topo: Topology,
    plan_wide: PlanWide,
    *,
    predicted: dict[str, Any] | None = None,
    solver: dict[str, Any] | None = None,
    provenance: dict[str, Any] | None = None,
    module: str | None = None,
    batch_size: int | None = None,
    splits: Sequence[SplitOption] = (),
) -> plans.Plan:
    """The optimizer's choices as a validated plan.

    Args:
        stats: the model's tables, in the plan's order.
        choices: every table's choice (a split table's parts' in its stead).
        topo: the target topology.
        plan_wide: collective precision and pipeline.
        predicted, solver, provenance: the plan's records (`PlanCost.predicted()`, the solver's).
        module: the EmbeddingBagCollection's path, if known.
        batch_size: samples per rank the statistics were priced at, for the plan's statistics
            digest (`statistics_digest`); default the `batch_size` `provenance` records (the
            optimizer's). With neither, the plan has no digest.
        splits: the splits chosen (plan format 2); their parts get the plan's part names.
    Returns:
        The plan (round-tripped through its dict, so it is what a reader of the file gets).
    Raises:
        PlanError: the plan breaks a check.
    """
    if batch_size is None and isinstance((provenance or {}).get("batch_size"), int):
        batch_size = int((provenance or {})["batch_size"])
    plan = plans.Plan(
        model=fingerprints(stats),
        topology=plan_topology(topo),
        tables=[
            table_plan(_plan_named(q, splits), choices[q.name], topo)
            for q in _sharded(stats, splits)
        ],
        splits=[o.split() for o in splits],
        comm_precision=plans.CommPrecision(forward=plan_wide.forward, backward=plan_wide.backward),
        pipeline=plan_wide.pipeline,
        module=module,
        predicted=predicted,
        solver=solver,
        provenance=provenance,
        statistics=statistics_digest(stats, batch_size) if batch_size is not None else None,
        source="<sparselift optimize>",
    )
    return plans.Plan.from_dict(plan.to_dict(), plan.source)


def _sharded(stats: list[TableStats], splits: Sequence[SplitOption]) -> list[TableStats]:
    """The tables as sharded: each split table replaced by its parts."""
    by_table = {o.table: o for o in splits}
    return [q for t in stats for q in (by_table[t.name].parts if t.name in by_table else (t,))]


def _plan_named(part: TableStats, splits: Sequence[SplitOption]) -> TableStats:
    """`part` under its name in the plan file (a model table: itself)."""
    for o in splits:
        if part in o.parts:
            return dataclasses.replace(part, name=o.plan_names[o.parts.index(part)])
    return part


def choices_from_plan(plan: Any, topo: Topology) -> tuple[dict[str, Choice], PlanWide]:
    """Read any plan (ours, TorchRec's converted, round-robin) back into choices the model prices.

    table_column_wise is priced as column shards on its ranks; a TWRW plan as its first rank's host.

    Args:
        plan: a Plan or a plan dict.
        topo: the topology to price on.
    Returns:
        (choices by table, plan-wide precision and pipeline).
    Raises:
        UserError: a table's sharding type is not one the optimizer prices.
    """
    if isinstance(plan, dict):
        plan = plans.Plan.from_dict(plan)
    out: dict[str, Choice] = {}
    for t in plan.tables:
        st = t.sharding_type
        if st == DP:
            ch = Choice(OptionClass(DP, "dense", topo.world_size))
        elif st == TW:
            ch = Choice(OptionClass(TW, t.compute_kernel, 1, t.cache_share), ranks=(t.ranks[0],))
        elif st in (CW, "table_column_wise"):
            rs = tuple(s.rank for s in t.shards) or tuple(t.ranks)
            ch = Choice(OptionClass(CW, t.compute_kernel, len(rs), t.cache_share), ranks=rs)
        elif st == RW:
            ch = Choice(OptionClass(RW, t.compute_kernel, topo.world_size, t.cache_share))
        elif st == TWRW:
            ch = Choice(
                OptionClass(TWRW, t.compute_kernel, topo.local_world_size, t.cache_share),
                host=t.ranks[0] // topo.local_world_size,
            )
        else:
            raise UserError(
                f"{plan.source}: table {t.name!r}: sharding type {st!r} "
                "is not priced by the optimizer"
            )
        out[t.name] = ch
    plan_wide = PlanWide(
        forward=plan.comm_precision.forward,
        backward=plan.comm_precision.backward,
        pipeline=plan.pipeline,
    )
    return out, plan_wide
