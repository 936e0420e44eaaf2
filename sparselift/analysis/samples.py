"""Per-call samples for the calibration: each sparse-path call's size x and exposed time y.

A call is one sharding-type group's TBE kernel (lookups) or its distribution (input_dist: splits +
lengths + values all-to-alls and permutes; output_dist: the pooled collective), on one rank in one
step. Lookups are sized in work units (`sparselift.kernels.lookup_work`), distributions in bytes the
rank sends, counted from the plan where it is known (`volumes`), exactly as the optimizer's cost
model counts them, so that a fitted per-unit cost means the same thing in both places.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sparselift.kernels import KERNEL_UNIT, LookupUnit, expected_unique, lookup_work

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
    "ids",
    "unique",
    "bag_elems",
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


LOOKUP_PARTS = ["ids", "unique", "bag_elems", "dim"]


def lookup_parts_per_node(
    nodes: pd.DataFrame,
    access: pd.DataFrame | None,
    plan_tables: pd.DataFrame,
    world_size: int,
) -> pd.DataFrame:
    """What each lookup node's work is made of: ids, distinct rows, pooled elements, row width.

    The trace gives each node's ids; the distinct rows its tables' shards touch are expected from
    the profiled ids per table and their fitted Zipf skew (a trace does not say how many ids were
    distinct), and its pooled outputs from the batch (every rank's; a data-parallel table's own).
    Kept apart, not summed into work units, so that a joint calibration can refit the unit's
    weights (`kernels.LookupUnit`).

    Args:
        nodes: lookup nodes (`kind`, `rank`, `ids`, `x`, `tables` columns).
        access: the profile's access statistics; None or empty: ids and width alone.
        plan_tables: the plan in force, one row per shard (`profile.plan_tables`).
        world_size: ranks profiled.
    Returns:
        LOOKUP_PARTS columns, indexed like the lookup nodes of `nodes`.
    """
    look = nodes[nodes["kind"].isin(LOOKUPS)]
    ids_col, x_col = look["ids"].fillna(0).astype(float), look["x"].fillna(0).astype(float)
    dims = x_col / ids_col.clip(lower=1)
    if access is None or access.empty:
        return pd.DataFrame(
            {"ids": ids_col, "unique": 0.0, "bag_elems": 0.0, "dim": dims}, index=look.index
        )
    ids_per_rank = access.groupby(["table", "rank"])["ids"].mean()
    ids_per_table = ids_per_rank.groupby("table").sum()
    meta = access.groupby("table")[
        ["num_embeddings", "embedding_dim", "zipf_alpha", "batch_size"]
    ].first()
    shard = plan_tables.groupby(["table", "rank"]).agg(
        sharding_type=("sharding_type", "first"), rows=("rows", "sum"), cols=("cols", "sum")
    )
    rows_out = []
    for rank, tables in zip(look["rank"], look["tables"].fillna(""), strict=True):
        unique = bag_elems = 0.0
        for t in filter(None, str(tables).split(",")):
            if t not in meta.index:
                continue
            n, alpha = int(meta.at[t, "num_embeddings"]), float(meta.at[t, "zipf_alpha"] or 0.0)
            st, rows, cols = (
                shard.loc[(t, rank)]
                if (t, rank) in shard.index
                else ("table_wise", n, meta.at[t, "embedding_dim"])
            )
            bags = float(meta.at[t, "batch_size"]) * (1 if st == "data_parallel" else world_size)
            bag_elems += bags * float(cols)
            if st == "data_parallel":
                unique += expected_unique(n, alpha, float(ids_per_rank.get((t, rank), 0.0)))
            else:
                unique += expected_unique(n, alpha, float(ids_per_table.get(t, 0.0))) * min(
                    1.0, float(rows) / n
                )
        rows_out.append((unique, bag_elems))
    parts = pd.DataFrame(rows_out, columns=["unique", "bag_elems"], index=look.index, dtype=float)
    parts.insert(0, "ids", ids_col)
    parts["dim"] = dims
    return parts[LOOKUP_PARTS]


def lookup_work_of(
    parts: pd.DataFrame, kinds: pd.Series, device: str, unit: LookupUnit = KERNEL_UNIT
) -> pd.Series:
    """Work units (`sparselift.kernels.lookup_work`) of lookup calls from their parts.

    Args:
        parts: LOOKUP_PARTS columns (`lookup_parts_per_node`), or call samples' (without `dim`,
            which the CPU unit does not read).
        kinds: each row's kind ("lookup_fwd" / "lookup_bwd"), indexed like `parts`.
        device: "cpu" or "cuda" (the unit differs).
        unit: the CPU unit's weights.
    Returns:
        Work units, indexed like `parts`.
    """
    dims = parts["dim"] if "dim" in parts else pd.Series(0.0, index=parts.index)
    return pd.Series(
        [
            lookup_work(k, device, i, u, d, b, unit)
            for k, i, u, b, d in zip(
                kinds, parts["ids"], parts["unique"], parts["bag_elems"], dims, strict=True
            )
        ],
        index=parts.index,
        dtype=float,
    )


def call_samples(nodes: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """One sample per call: (rank, step, kind, group) with the call's x and exposed time y.

    Lookups: y = the group's TBE compute, x = its work units (the nodes' `x`). Distributions: y =
    compute + wait on the main thread, x = bytes its collectives send (`sent_bytes`). Module-wide
    work outside any group (sharding "*") is spread evenly over the step's groups.

    Args:
        nodes: graph nodes (`reconstruct.NODE_COLUMNS`), lookups' `x` in work units.
        world_size: ranks profiled.
    Returns:
        SAMPLE_COLUMNS: also `wait` (main-thread wait), `transfer` (the collectives' transfer time,
        for the overlap share), `calls` (groups of that kind in the step) and, for lookups, the
        parts of x (`ids`, `unique`, `bag_elems`: 0 where the nodes do not carry them).
    """
    n = nodes[nodes["kind"].isin((*LOOKUPS, *DIST))].copy()
    n["sharding"] = n["sharding"].fillna("*")
    n["sent"] = 0.0
    coll = n["part"] == "collective"
    n.loc[coll, "sent"] = sent_bytes(n[coll], world_size)
    rows = []
    for (rank, step, kind), g in n.groupby(["rank", "step", "kind"]):
        main = g[g["part"] != "collective"]
        shared = main[main["sharding"] == "*"]["dur_s"].sum()
        groups = [s for s in g["sharding"].unique() if s != "*"] or ["*"]
        for sh in groups:
            s = g[g["sharding"] == sh]
            m = s[s["part"] != "collective"]
            c = s[s["part"] == "collective"]
            y = m["dur_s"].sum() + (shared / len(groups) if sh != "*" else 0.0)
            look = kind.startswith("lookup")
            x = m["x"].sum() if look else c["sent"].sum()

            def part(col: str, m: pd.DataFrame = m, look: bool = look) -> float:
                return float(m[col].fillna(0).sum()) if look and col in m else 0.0

            rows.append(
                dict(
                    rank=rank,
                    step=step,
                    kind=kind,
                    group=sh,
                    x=float(x),
                    y=float(y),
                    wait=float(m[m["part"] == "wait"]["dur_s"].sum()),
                    transfer=float(c["transfer_s"].fillna(c["dur_s"]).sum()),
                    calls=len(groups),
                    ids=part("ids"),
                    unique=part("unique"),
                    bag_elems=part("bag_elems"),
                )
            )
    return pd.DataFrame(rows, columns=SAMPLE_COLUMNS)


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
