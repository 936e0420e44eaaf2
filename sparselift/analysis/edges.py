"""Edges of the sparse-path graph: data dependencies, collective launches and waits, peers.

The edges within a rank (`rank_edges`) need only that rank's nodes, so they are made where the
rank is analyzed; only the `peer` edges join ranks (`peer_edges`), from the collective nodes'
arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from sparselift.analysis.ordered import group_codes

# the sparse path's op kinds in data order: a module's stage feeds the next one
STAGE_ORDER = ["input_dist", "lookup_fwd", "output_dist_fwd", "output_dist_bwd", "lookup_bwd"]
EDGE_COLUMNS = ["src", "dst", "kind"]


def edge_frame(
    src: Sequence[int] | np.ndarray, dst: Sequence[int] | np.ndarray, kind: list[str]
) -> pd.DataFrame:
    """src, dst (int64 node ids), kind as one DataFrame (EDGE_COLUMNS).

    Returns:
        The frame; an empty one is typed as the row-by-row construction types it.
    """
    if not len(kind):
        return pd.DataFrame([], columns=EDGE_COLUMNS).astype({"src": "int64", "dst": "int64"})
    return pd.DataFrame(
        {
            "src": np.asarray(src, dtype=np.int64),
            "dst": np.asarray(dst, dtype=np.int64),
            "kind": kind,
        }
    )


def rank_edges(nodes: pd.DataFrame) -> tuple[list[int], list[int], list[str]]:
    """The edges within each rank of `nodes` (`reconstruct.NODE_COLUMNS`, sorted by rank, step
    and start, numbered by `node_id`).

    Per (rank, step, module), in that sorted order: `data` from each stage's last node to the next
    stage's first (in STAGE_ORDER; first and last by start), then per stage `launch` from its
    first compute node to each of its collectives and `wait` from each collective to the stage's
    wait nodes.

    Returns:
        src, dst, kind lists, in that order.
    """
    src: list[int] = []
    dst: list[int] = []
    kinds: list[str] = []
    sparse = nodes[nodes["kind"].isin(STAGE_ORDER)]
    if sparse.empty:
        return src, dst, kinds
    codes, _ = group_codes(sparse, ["rank", "step", "module"])
    order = np.argsort(codes, kind="stable")
    kind_of = sparse["kind"].to_numpy(dtype=object)[order].tolist()
    part_of = sparse["part"].to_numpy(dtype=object)[order].tolist()
    ids = sparse["node_id"].to_numpy(dtype=np.int64)[order].tolist()
    starts = sparse["start_us"].to_numpy(dtype=np.float64)[order]
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), len(ids)], strict=True):
        rows: dict[str, list[int]] = {}
        for i in range(a, b):
            rows.setdefault(kind_of[i], []).append(i)
        present = [k for k in STAGE_ORDER if k in rows]
        first, last = {}, {}
        for k in present:
            # by start as `sort_values` orders them (ties as its sort leaves them)
            by_start = np.argsort(starts[rows[k]], kind="quicksort")
            first[k], last[k] = ids[rows[k][by_start[0]]], ids[rows[k][by_start[-1]]]
        for k_a, k_b in zip(present, present[1:], strict=False):
            src.append(last[k_a])
            dst.append(first[k_b])
            kinds.append("data")
        for k in present:
            comp = [ids[i] for i in rows[k] if part_of[i] == "compute"]
            wait = [ids[i] for i in rows[k] if part_of[i] == "wait"]
            for c in (ids[i] for i in rows[k] if part_of[i] == "collective"):
                if comp:
                    src.append(comp[0])
                    dst.append(c)
                    kinds.append("launch")
                for w in wait:
                    src.append(c)
                    dst.append(w)
                    kinds.append("wait")
    return src, dst, kinds


def peer_edges(nodes: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """`peer` edges between the ranks' nodes of the same collective call (`coll_key`), in rank
    order, calls in sorted key order.

    Returns:
        src, dst node-id arrays.
    """
    coll = nodes[(nodes["part"] == "collective") & nodes["coll_key"].notna()]
    if coll.empty:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    codes, _ = pd.factorize(coll["coll_key"], sort=True)
    order = np.lexsort((coll["rank"].to_numpy(), codes))
    ids, keys = coll["node_id"].to_numpy(dtype=np.int64)[order], codes[order]
    same = keys[1:] == keys[:-1]
    return ids[:-1][same], ids[1:][same]


def build_edges(nodes: pd.DataFrame) -> pd.DataFrame:
    """The edges between `nodes` (`reconstruct.NODE_COLUMNS`, numbered by `node_id`): every
    rank's own (`rank_edges`), then the `peer` edges across ranks (`peer_edges`).

    Returns:
        src, dst (int64 node ids), kind.
    """
    src, dst, kinds = rank_edges(nodes)
    p_src, p_dst = peer_edges(nodes)
    return edge_frame(
        np.concatenate([np.asarray(src, dtype=np.int64), p_src]),
        np.concatenate([np.asarray(dst, dtype=np.int64), p_dst]),
        kinds + ["peer"] * len(p_src),
    )
