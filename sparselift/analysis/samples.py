"""Per-call samples for the calibration: each sparse-path call's size x and exposed time y.

A call is one sharding-type group's TBE kernel (lookups) or its distribution (input_dist: splits +
lengths + values all-to-alls and permutes; output_dist: the pooled collective), on one rank in one
step. Each collection (EmbeddingBagCollection, EmbeddingCollection, ...) runs its own calls for
each of its sharding types: a sample adds up the calls of its group's collections and counts them
(`n_calls`), so that fits price one call and the optimizer counts one per collection.
Lookups are sized in work units (`sparselift.kernels.lookup_work`), distributions in bytes the
rank sends, counted from the plan where it is known (`volumes`), exactly as the optimizer's cost
model counts them, so that a fitted per-unit cost means the same thing in both places.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sparselift.analysis.ordered import group_codes, ordered_sums
from sparselift.kernels import (
    KERNEL_UNIT,
    LookupUnit,
    expected_unique,
    footprint_far,
    lookup_work,
)

LOOKUPS = ("lookup_fwd", "lookup_bwd")
DIST = ("input_dist", "output_dist_fwd", "output_dist_bwd")
SAMPLE_COLUMNS = [
    "rank",
    "step",
    "kind",
    "group",
    "x",
    "y",
    "wait",
    "transfer",
    "calls",
    "n_calls",
    "ids",
    "unique",
    "bag_elems",
    "far",
]


def sent_bytes(coll: pd.DataFrame, world_size: int) -> pd.Series:
    """Bytes each collective node sends off its rank, from its tensor size (as the cost model).

    An all-to-all keeps the rank's own chunk; a ring all-reduce (also gloo's stand-in for
    reduce-scatter) sends every other chunk twice (reduce, then gather); an all-gather sends its
    input to every peer.

    Args:
        coll: collective nodes (`coll_op`, `bytes` columns).
        world_size: ranks in the collective.
    Returns:
        Bytes sent, indexed like `coll`.
    """
    w = max(world_size, 1)
    op = coll["coll_op"].fillna("")
    factor = np.where(
        op.str.contains("gather"),
        w - 1,
        np.where(op.str.contains("all_reduce"), 2 * (w - 1) / w, (w - 1) / w),
    )
    return coll["bytes"].astype(float) * factor


X_PARTS = ("ids", "unique", "bag_elems", "far")  # the parts of a lookup's work units
LOOKUP_PARTS = [*X_PARTS, "dim"]


@dataclass(frozen=True)
class LookupContext:
    """What sizing lookup nodes (`lookup_parts`) needs of a profile's access statistics and plan,
    reduced to a few values per table and per (table, rank), so that it travels to every rank's
    worker instead of the statistics themselves.

    Attributes:
        ids_per_rank: (table, rank) → mean ids a step.
        ids_per_table: table → the ranks' ids_per_rank added up.
        meta: table → (num_embeddings, embedding_dim, zipf_alpha, batch_size), as recorded.
        shard: (table, rank) → (sharding_type, rows, cols) of the rank's shards of the table.
        sequence: the sequence tables (an EmbeddingCollection's: one output row per id).
    """

    ids_per_rank: dict[tuple[Any, Any], float]
    ids_per_table: dict[Any, float]
    meta: dict[Any, tuple[Any, Any, Any, Any]]
    shard: dict[tuple[Any, Any], tuple[Any, Any, Any]]
    sequence: frozenset[str] = frozenset()


def lookup_context(
    access: pd.DataFrame | None, plan_tables: pd.DataFrame, sequence: frozenset[str] = frozenset()
) -> LookupContext | None:
    """The `LookupContext` of a profile's access statistics and plan (and its `sequence`
    tables); None without statistics."""
    if access is None or access.empty:
        return None
    ids_per_rank = access.groupby(["table", "rank"])["ids"].mean()
    ids_per_table = ids_per_rank.groupby("table").sum()
    meta = access.groupby("table")[
        ["num_embeddings", "embedding_dim", "zipf_alpha", "batch_size"]
    ].first()
    shard = plan_tables.groupby(["table", "rank"]).agg(
        sharding_type=("sharding_type", "first"), rows=("rows", "sum"), cols=("cols", "sum")
    )
    return LookupContext(
        ids_per_rank=dict(ids_per_rank.items()),
        ids_per_table=dict(ids_per_table.items()),
        meta={t: tuple(v) for t, v in zip(meta.index, meta.itertuples(index=False), strict=True)},
        shard={
            k: tuple(v) for k, v in zip(shard.index, shard.itertuples(index=False), strict=True)
        },
        sequence=sequence,
    )


def lookup_parts(nodes: pd.DataFrame, ctx: LookupContext | None, world_size: int) -> pd.DataFrame:
    """What each lookup node's work is made of: ids, distinct rows, output elements, row width.

    The trace gives each node's ids; the distinct rows its tables' shards touch are expected from
    the profiled ids per table and their fitted Zipf skew (a trace does not say how many ids were
    distinct), and its outputs from the batch (every rank's bags; a data-parallel table's own),
    or for a sequence table from its ids (one row each). Kept apart, not summed into work units,
    so that a joint calibration can refit the unit's weights (`kernels.LookupUnit`). A node's
    parts depend on its own rank and tables only, so each rank's are made on its own.

    Args:
        nodes: lookup nodes (`kind`, `rank`, `ids`, `x`, `tables` columns).
        ctx: the profile's `lookup_context`; None: ids and width alone.
        world_size: ranks profiled.
    Returns:
        LOOKUP_PARTS columns, indexed like the lookup nodes of `nodes`.
    """
    look = nodes[nodes["kind"].isin(LOOKUPS)]
    ids_col, x_col = look["ids"].fillna(0).astype(float), look["x"].fillna(0).astype(float)
    dims = x_col / ids_col.clip(lower=1)
    if ctx is None:
        return pd.DataFrame(
            {"ids": ids_col, "unique": 0.0, "bag_elems": 0.0, "far": 0.0, "dim": dims},
            index=look.index,
        )
    rows_out = []
    for rank, tables in zip(look["rank"], look["tables"].fillna(""), strict=True):
        unique = bag_elems = far = 0.0
        for t in filter(None, str(tables).split(",")):
            if t not in ctx.meta:
                continue
            num, dim, zipf, batch = ctx.meta[t]
            n, alpha = int(num), float(zipf or 0.0)
            st, rows, cols = ctx.shard.get((t, rank), ("table_wise", n, dim))
            if st == "data_parallel":
                ids = float(ctx.ids_per_rank.get((t, rank), 0.0))
                bags = float(batch)
                u = expected_unique(n, alpha, ids)
            else:
                share = min(1.0, float(rows) / n)
                ids = float(ctx.ids_per_table.get(t, 0.0)) * share
                bags = float(batch) * world_size
                u = expected_unique(n, alpha, float(ctx.ids_per_table.get(t, 0.0))) * share
            unique += u
            far += footprint_far(u, float(rows), float(cols))
            bag_elems += (ids if t in ctx.sequence else bags) * float(cols)
        rows_out.append((unique, bag_elems, far))
    parts = pd.DataFrame(
        rows_out, columns=["unique", "bag_elems", "far"], index=look.index, dtype=float
    )
    parts.insert(0, "ids", ids_col)
    parts["dim"] = dims
    return parts[LOOKUP_PARTS]


def lookup_work_of(
    parts: pd.DataFrame, kinds: pd.Series, device: str, unit: LookupUnit = KERNEL_UNIT
) -> pd.Series:
    """Work units (`sparselift.kernels.lookup_work`) of lookup calls from their parts.

    Args:
        parts: LOOKUP_PARTS columns (`lookup_parts`), or call samples' (without `dim`,
            which the CPU unit does not read).
        kinds: each row's kind ("lookup_fwd" / "lookup_bwd"), indexed like `parts`.
        device: "cpu" or "cuda" (the unit differs).
        unit: the CPU unit's weights.
    Returns:
        Work units, indexed like `parts`.
    """
    dims = parts["dim"] if "dim" in parts else pd.Series(0.0, index=parts.index)
    far = parts["far"] if "far" in parts else pd.Series(0.0, index=parts.index)
    return pd.Series(
        [
            lookup_work(k, device, i, u, d, b, unit, f)
            for k, i, u, b, f, d in zip(
                kinds, parts["ids"], parts["unique"], parts["bag_elems"], far, dims, strict=True
            )
        ],
        index=parts.index,
        dtype=float,
    )


def call_samples(nodes: pd.DataFrame, world_size: int, transfer: bool = True) -> pd.DataFrame:
    """One sample per call: (rank, step, kind, group) with the call's x and exposed time y.

    Lookups: y = the group's TBE compute, x = its work units (the nodes' `x`). Distributions: y =
    compute + wait on the main thread, x = bytes its collectives send (`sent_bytes`). Module-wide
    work outside any group (sharding "*") is spread evenly over the step's groups. A sample needs
    only its own rank's nodes, but for `transfer`, which pairs collectives across ranks: so each
    rank's samples can be made apart (`transfer=False`) and given it once the ranks are merged
    (`with_transfer`).

    Args:
        nodes: graph nodes (`reconstruct.NODE_COLUMNS`), lookups' `x` in work units.
        world_size: ranks profiled.
        transfer: fill `transfer` from the nodes' `transfer_s` (False: NaN).
    Returns:
        SAMPLE_COLUMNS, sorted by rank, step and kind, groups in the order the nodes name them:
        also `wait` (main-thread wait), `transfer` (the collectives' transfer time, for the
        overlap share), `n_calls` (the sample's calls: the collections whose nodes of the group
        it adds up, at least 1), `calls` (the step's calls of that kind) and, for lookups, the
        parts of x (X_PARTS: 0 where the nodes do not carry them). Sums add the nodes in node
        order, as `Series.sum` does.
    """
    n = nodes[nodes["kind"].isin((*LOOKUPS, *DIST))]
    rows: list[dict[str, Any]] = []
    if not n.empty:
        coll = (n["part"] == "collective").to_numpy()
        sent = np.zeros(len(n))
        sent[coll] = sent_bytes(n[coll], world_size).to_numpy(dtype=float)
        codes, _ = group_codes(n, ["rank", "step", "kind"])
        order = np.argsort(codes, kind="stable")
        col = {c: n[c].to_numpy(dtype=object)[order].tolist() for c in ("rank", "step", "kind")}
        shard = n["sharding"].fillna("*").to_numpy(dtype=object)[order].tolist()
        mods = n["module"].fillna("*") if "module" in n else pd.Series("*", index=n.index)
        module = mods.to_numpy(dtype=object)[order].tolist()
        part = n["part"].to_numpy(dtype=object)[order].tolist()
        # NaN counts as 0, as `Series.sum` skips it
        num = {"dur_s": n["dur_s"].fillna(0), "x": n["x"].fillna(0), "sent": sent}
        parts = [c for c in X_PARTS if c in n]
        num.update({c: n[c].fillna(0) for c in parts})
        val = {c: np.asarray(v, dtype=np.float64)[order] for c, v in num.items()}
        bounds = np.flatnonzero(np.diff(codes[order])) + 1
        for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), len(order)], strict=True):
            rows += _samples_of(range(a, b), col, shard, module, part, val, parts)
    out = pd.DataFrame(rows, columns=SAMPLE_COLUMNS)
    return with_transfer(out, nodes) if transfer else out


def _samples_of(
    span: range,
    col: dict[str, list[Any]],
    shard: list[Any],
    module: list[Any],
    part: list[Any],
    val: dict[str, np.ndarray],
    parts: list[str],
) -> list[dict[str, Any]]:
    """The samples of one (rank, step, kind): rows `span` of the sorted columns (a module "*":
    not known, counted with the group's named collections)."""
    rank, step, kind = col["rank"][span[0]], col["step"][span[0]], col["kind"][span[0]]
    look = kind.startswith("lookup")
    main = [i for i in span if part[i] != "collective"]
    shared = _sum(val["dur_s"], [i for i in main if shard[i] == "*"])
    groups = list(dict.fromkeys(shard[i] for i in span if shard[i] != "*")) or ["*"]
    n_calls = {
        sh: max(1, len({module[i] for i in span if shard[i] == sh and module[i] != "*"}))
        for sh in groups
    }
    out = []
    for sh in groups:
        m = [i for i in main if shard[i] == sh]
        c = [i for i in span if shard[i] == sh and part[i] == "collective"]
        y = _sum(val["dur_s"], m) + (shared / len(groups) if sh != "*" else 0.0)
        x = _sum(val["x"], m) if look else _sum(val["sent"], c)
        wait = _sum(val["dur_s"], [i for i in m if part[i] == "wait"])
        pieces = {p: _sum(val[p], m) if look and p in parts else 0.0 for p in X_PARTS}
        out.append(
            dict(
                rank=rank,
                step=step,
                kind=kind,
                group=sh,
                x=x,
                y=y,
                wait=wait,
                transfer=np.nan,
                calls=sum(n_calls.values()),
                n_calls=n_calls[sh],
                **pieces,
            )
        )
    return out


def _sum(values: np.ndarray, rows: list[int]) -> float:
    """values[rows] added up as `Series.sum` adds them (numpy's pairwise sum, in order)."""
    return float(values[rows].sum()) if rows else 0.0


def with_transfer(calls: pd.DataFrame, nodes: pd.DataFrame) -> pd.DataFrame:
    """`calls` with `transfer`: per call, its collectives' `transfer_s` (`dur_s` where unpaired)
    added up in node order.

    Args:
        calls: `call_samples` of some of `nodes`' ranks and steps.
        nodes: graph nodes whose collectives are paired (`collectives.pair_collectives`).
    Returns:
        A copy of `calls`; 0 for a call without collectives.
    """
    keys = ["rank", "step", "kind", "group"]
    c = nodes[(nodes["part"] == "collective") & nodes["kind"].isin((*LOOKUPS, *DIST))]
    out = calls.copy()
    if out.empty:
        return out
    at = pd.MultiIndex.from_frame(out[keys]).get_indexer(
        pd.MultiIndex.from_arrays(
            [c["rank"], c["step"], c["kind"], c["sharding"].fillna("*")], names=keys
        )
    )
    value = c["transfer_s"].fillna(c["dur_s"]).to_numpy(dtype=np.float64)
    out["transfer"] = ordered_sums(value, at, len(out))
    return out


def with_plan_bytes(calls: pd.DataFrame, plan_bytes: pd.DataFrame) -> pd.DataFrame:
    """`calls` with each distribution call's x replaced by the bytes the plan makes it move.

    Args:
        calls: `call_samples` output.
        plan_bytes: `volumes.dist_bytes` output (rank, step, kind, group, x).
    Returns:
        A copy of `calls`; calls the plan does not count keep the trace's even-split estimate.
    """
    keys = ["rank", "step", "kind", "group"]
    m = calls.merge(plan_bytes.rename(columns={"x": "plan_x"}), on=keys, how="left")
    dist = m["kind"].isin(DIST) & m["plan_x"].notna()
    m.loc[dist, "x"] = m.loc[dist, "plan_x"]
    return m.drop(columns="plan_x")


def n_calls_of(calls: pd.DataFrame) -> pd.Series:
    """The calls each sample adds up (`n_calls`; 1 where samples do not say)."""
    if "n_calls" not in calls:
        return pd.Series(1.0, index=calls.index)
    return calls["n_calls"].fillna(1).clip(lower=1).astype(float)
