"""Bytes each rank moves in the sparse path, counted from the plan and the profiled ids.

A trace records each collective's whole tensor, not how it splits over peers, so with an unbalanced
table-wise plan it cannot say which rank sent more. The plan and the per-rank id counts can, and
counting them exactly as the optimizer's cost model does (`sparselift.optimizer.cost_model`) makes
the fitted per-byte costs mean the same thing in both places.

On gloo a rank's own CPU copies every byte it sends and every byte it receives (between ranks of
one host an all-to-all takes about as long with nearly all its bytes going one way as with half
each way, `kernels.both_ends`), so there an all-to-all's bytes count at both ends. On NCCL
the links carry both directions at once, and the bytes count where a shard's rank is unbalanced.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from sparselift.kernels import FLOAT_BYTES, ID_BYTES, LENGTH_BYTES, both_ends
from sparselift.profile_manifest import is_sequence_table

SHARDED = ("table_wise", "column_wise", "row_wise", "table_row_wise")
GROUPS = sorted(SHARDED)


def dist_bytes(
    access: pd.DataFrame, plan_tables: pd.DataFrame, manifest: dict[str, Any]
) -> pd.DataFrame:
    """Bytes each rank moves for each sharding-type group's distributions, in each step (one host).

    A table-wise or column-wise shard's rank sends its outputs and receives every other rank's ids
    and gradients; on gloo each other rank also counts what it sends that rank and receives from
    it (`both_ends`). Row-wise shards send their share of the ids (and on gloo receive the others'
    share), and gloo's row-wise output is a ring all-reduce of the whole output, its backward an
    all-gather. An EmbeddingCollection's table (`pooling_type` "NONE") returns one row per id,
    not per sample: its outputs are counted from the ids, and row-wise ones by all-to-all.

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
    sequence = {t["name"] for t in manifest.get("tables") or [] if is_sequence_table(t)}
    gloo = (manifest.get("backend") or "gloo") == "gloo"
    peers = both_ends(manifest.get("device") or "cpu") and gloo
    shards = plan_tables[plan_tables["sharding_type"].isin(SHARDED)]
    steps = np.array(sorted(access["step"].unique()), dtype=np.int64)
    owners = shards["rank"].to_numpy(dtype=np.int64)
    ranks = np.union1d(np.arange(world, dtype=np.int64), owners)
    # one accumulator per (rank, step, kind, group), laid out in sorted key order; each is added
    # to in the order the ranks' and shards' loops would add to it (sequentially, from 0.0)
    acc = _Accumulator(len(ranks), len(steps))
    ids = _ids_by_table(access, steps, world)
    r_of = np.searchsorted(ranks, np.arange(world))  # rank r → its accumulator row
    for (table, st), sh in shards.groupby(["table", "sharding_type"]):
        lengths = batch * feats.get(table, 1) * LENGTH_BYTES
        table_ids = ids.get(table, np.zeros((len(steps), world)))  # [step, r]
        idb = table_ids * ID_BYTES + lengths
        if st in ("table_wise", "column_wise"):  # counted at the shard's rank, which receives
            own = np.searchsorted(ranks, sh["rank"].to_numpy(dtype=np.int64))  # ids, gradients
            outs = np.array([batch * c * FLOAT_BYTES for c in sh["cols"]], dtype=np.float64)
            away = own[None, :] != r_of[:, None]  # [r, shard]
            grid = (len(steps), world, len(own))  # the loops' order: step, r, shard
            if table in sequence:  # rank r's ids' rows: [step, r, shard]
                cols = sh["cols"].to_numpy(dtype=np.float64)
                outs = table_ids[:, :, None] * cols[None, None, :] * FLOAT_BYTES
            at = np.broadcast_to(own, grid)
            acc.add(at, "output_dist_fwd", st, np.where(away, outs, 0.0), None)
            acc.add(at, "input_dist", st, np.broadcast_to(idb[:, :, None], grid), away)
            acc.add(at, "output_dist_bwd", st, np.broadcast_to(outs, grid), away)
            if peers:  # … and at the other end: each rank's ids out, its outputs and grads
                peer = np.broadcast_to(r_of[:, None], away.shape)
                at = np.broadcast_to(peer, grid)
                acc.add(at, "output_dist_fwd", st, np.broadcast_to(outs, grid), away)
                acc.add(at, "input_dist", st, np.broadcast_to(idb[:, :, None], grid), away)
                acc.add(at, "output_dist_bwd", st, np.broadcast_to(outs, grid), away)
        else:  # row-wise buckets: every rank keeps 1/W of its ids
            out = batch * float(sh["cols"].max()) * FLOAT_BYTES
            per_rank = (len(steps), world)
            at = np.broadcast_to(r_of, per_rank)
            fwd = 2.0 * (world - 1) * out if gloo and st == "row_wise" else (world - 1) * out
            ids_x = idb * (world - 1) / world  # sent; on gloo also the others' share received
            if peers:
                ids_x = ids_x + (idb.sum(axis=1, keepdims=True) - idb) / world
            acc.add(at, "input_dist", st, ids_x, None)
            if table in sequence:  # all-to-all of the rows of the ids each rank sent away
                rows_x = table_ids * float(sh["cols"].max()) * FLOAT_BYTES * (world - 1) / world
                acc.add(at, "output_dist_fwd", st, rows_x, None)
                acc.add(at, "output_dist_bwd", st, rows_x, None)
                continue
            acc.add(at, "output_dist_fwd", st, np.full(per_rank, fwd, dtype=np.float64), None)
            acc.add(at, "output_dist_bwd", st, np.full(per_rank, (world - 1) * out, float), None)
    return acc.frame(ranks, steps)


KINDS = sorted(("input_dist", "output_dist_fwd", "output_dist_bwd"))


class _Accumulator:
    """Sums per (rank, step, kind, group), dense in sorted key order, added to in call order."""

    def __init__(self, n_ranks: int, n_steps: int) -> None:
        self.shape = (n_ranks, n_steps, len(KINDS), len(SHARDED))
        self.sums = np.zeros(self.shape, dtype=np.float64)
        self.seen = np.zeros(self.shape, dtype=bool)

    def add(
        self, at: np.ndarray, kind: str, group: str, x: np.ndarray, where: np.ndarray | None
    ) -> None:
        """Add x[step, r, ...] to the accumulator of rank row at[step, r, ...] (where `where`)."""
        shape = np.broadcast_shapes(at.shape, x.shape)
        step = np.broadcast_to(
            np.arange(self.shape[1]).reshape((-1,) + (1,) * (len(shape) - 1)), shape
        )
        keep = np.ones(shape, dtype=bool) if where is None else np.broadcast_to(where, shape)
        flat = np.ravel_multi_index(
            (
                np.broadcast_to(at, shape)[keep],
                step[keep],
                np.full(int(keep.sum()), KINDS.index(kind)),
                np.full(int(keep.sum()), GROUPS.index(group)),
            ),
            self.shape,
        )
        np.add.at(self.sums.reshape(-1), flat, np.broadcast_to(x, shape)[keep])
        self.seen.reshape(-1)[flat] = True

    def frame(self, ranks: np.ndarray, steps: np.ndarray) -> pd.DataFrame:
        """The keys added to, sorted, with their sums."""
        r, s, k, g = np.nonzero(self.seen)
        if not len(r):
            return pd.DataFrame([], columns=["rank", "step", "kind", "group", "x"])
        return pd.DataFrame(
            {
                "rank": ranks[r],
                "step": steps[s],
                "kind": [KINDS[i] for i in k],
                "group": [GROUPS[i] for i in g],
                "x": self.sums[r, s, k, g],
            }
        )


def _ids_by_table(access: pd.DataFrame, steps: np.ndarray, world: int) -> dict[Any, np.ndarray]:
    """Per table, ids per [step, rank] (0 where not recorded), for ranks below `world`."""
    a = access[(access["rank"] >= 0) & (access["rank"] < world)]
    out = {}
    for table, g in a.groupby("table"):
        m = np.zeros((len(steps), world), dtype=np.float64)
        m[np.searchsorted(steps, g["step"].to_numpy()), g["rank"].to_numpy()] = g["ids"].to_numpy(
            dtype=np.float64
        )
        out[table] = m
    return out
