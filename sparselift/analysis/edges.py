"""Edges of the sparse-path graph: data dependencies, collective launches and waits, peers."""

from __future__ import annotations

import pandas as pd

# the sparse path's op kinds in data order: a module's stage feeds the next one
STAGE_ORDER = ["input_dist", "lookup_fwd", "output_dist_fwd", "output_dist_bwd", "lookup_bwd"]


def build_edges(nodes: pd.DataFrame) -> pd.DataFrame:
    """The edges between `nodes` (`reconstruct.NODE_COLUMNS`, numbered by `node_id`).

    Per (rank, step, module): `data` from each stage's last node to the next stage's first (in
    STAGE_ORDER), `launch` from a stage's first compute node to each of its collectives, `wait`
    from each collective to the stage's wait nodes. Across ranks: `peer` between the ranks'
    nodes of the same collective call, in rank order.

    Returns:
        src, dst (int64 node ids), kind.
    """
    rows = []
    sparse = nodes[nodes["kind"].isin(STAGE_ORDER)]
    for _key, g in sparse.groupby(["rank", "step", "module"], dropna=False):
        first = {}
        last = {}
        for k in STAGE_ORDER:
            s = g[g["kind"] == k].sort_values("start_us")
            if len(s):
                first[k], last[k] = s["node_id"].iloc[0], s["node_id"].iloc[-1]
        present = [k for k in STAGE_ORDER if k in first]
        for a, b in zip(present, present[1:], strict=False):
            rows.append((last[a], first[b], "data"))
        for k in present:
            s = g[g["kind"] == k]
            comp = s[s["part"] == "compute"]["node_id"].tolist()
            wait = s[s["part"] == "wait"]["node_id"].tolist()
            for c in s[s["part"] == "collective"]["node_id"]:
                if comp:
                    rows.append((comp[0], c, "launch"))
                for w in wait:
                    rows.append((c, w, "wait"))
    coll = nodes[nodes["part"] == "collective"]
    for _, g in coll.groupby("coll_key"):
        ids = g.sort_values("rank")["node_id"].tolist()
        for a, b in zip(ids, ids[1:], strict=False):
            rows.append((a, b, "peer"))
    return pd.DataFrame(rows, columns=["src", "dst", "kind"]).astype(
        {"src": "int64", "dst": "int64"}
    )
