"""Bytes each rank moves in the sparse path, counted from the plan and the profiled ids.

A trace records each collective's whole tensor, not how it splits over peers, so with an unbalanced
table-wise plan it cannot say which rank sent more. The plan and the per-rank id counts can, and
counting them exactly as the optimizer's cost model does (`sparselift.optimizer.cost_model`) makes
the fitted per-byte costs mean the same thing in both places.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from sparselift.kernels import FLOAT_BYTES, ID_BYTES, LENGTH_BYTES

SHARDED = ("table_wise", "column_wise", "row_wise", "table_row_wise")


def dist_bytes(
    access: pd.DataFrame, plan_tables: pd.DataFrame, manifest: dict[str, Any]
) -> pd.DataFrame:
    """Bytes each rank moves for each sharding-type group's distributions, in each step (one host).

    A table-wise or column-wise shard's rank sends its outputs and receives every other rank's ids
    and gradients; row-wise shards send their share, and gloo's row-wise output is a ring
    all-reduce of the whole output, its backward an all-gather.

    Args:
        access: the profile's access statistics (ids per table, rank and step).
        plan_tables: the plan in force, one row per shard.
        manifest: the profile's manifest (world_size, batch_size, backend, tables' features).
    Returns:
        rank, step, kind (input_dist, output_dist_fwd, output_dist_bwd), group (sharding type), x
        (bytes), sorted by the first four.
    """
    world, batch = int(manifest["world_size"]), int(manifest.get("batch_size") or 0)
    feats = {
        t["name"]: max(1, len(t.get("feature_names") or []))
        for t in manifest.get("tables") or []
        if isinstance(t, dict) and "name" in t
    }
    gloo = (manifest.get("backend") or "gloo") == "gloo"
    shards = plan_tables[plan_tables["sharding_type"].isin(SHARDED)]
    ids = access.set_index(["table", "rank", "step"])["ids"]
    rows: dict[tuple[int, int, str, str], float] = {}

    def add(rank: int, step: int, kind: str, group: str, x: float) -> None:
        key = (rank, step, kind, group)
        rows[key] = rows.get(key, 0.0) + x

    steps = sorted(access["step"].unique())
    for (table, st), sh in shards.groupby(["table", "sharding_type"]):
        lengths = batch * feats.get(table, 1) * LENGTH_BYTES
        for step in steps:
            for r in range(world):
                idb = float(ids.get((table, r, step), 0.0)) * ID_BYTES + lengths
                if st in ("table_wise", "column_wise"):  # counted at the shard's rank, which
                    for owner, cols in zip(
                        sh["rank"], sh["cols"], strict=True
                    ):  # receives ids and gradients
                        out = batch * cols * FLOAT_BYTES
                        add(owner, step, "output_dist_fwd", st, 0.0 if owner == r else out)
                        if owner != r:
                            add(owner, step, "input_dist", st, idb)
                            add(owner, step, "output_dist_bwd", st, out)
                else:  # row-wise buckets: every rank keeps 1/W of its ids
                    out = batch * float(sh["cols"].max()) * FLOAT_BYTES
                    add(r, step, "input_dist", st, idb * (world - 1) / world)
                    fwd = (
                        2.0 * (world - 1) * out if gloo and st == "row_wise" else (world - 1) * out
                    )
                    add(r, step, "output_dist_fwd", st, fwd)
                    add(r, step, "output_dist_bwd", st, (world - 1) * out)
    return pd.DataFrame(
        [(*k, v) for k, v in sorted(rows.items())], columns=["rank", "step", "kind", "group", "x"]
    )
