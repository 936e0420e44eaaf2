"""Every rank's trace → the sparse path as a graph of nodes and edges, per step and module.

A step's main thread is cut into self-time segments (`stack`); each gets the sparse stage of its
call stack, or `dense`, or `idle`, and segments where the thread sits in a wait while a collective
is in flight are exposed communication. Collectives themselves (gloo worker threads, NCCL kernels
on streams) are separate network nodes, paired with the main-thread op that launched them and,
across ranks, by their order within the step (`collectives`). So a step's main-thread nodes tile
its measured time exactly, and what could not be placed is counted rather than silently dropped.

A rank's nodes and the edges within it need only its own trace (`rank_nodes`, `rank_graph`), so
they are made where the trace is parsed; `merge_graph` then joins the ranks' shares, pairing
collectives across ranks on the nodes' columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sparselift.analysis import names
from sparselift.analysis.collectives import launched_collectives, pair_collectives
from sparselift.analysis.edges import edge_frame, peer_edges, rank_edges
from sparselift.analysis.node_rows import (
    NODE_LABELS,
    fill_modules,
    kind_of,
    main_rows,
    merge_same,
    none_of,
)
from sparselift.analysis.stack import (
    annotate_stack,
    lookup_ids,
    main_thread,
    self_segments,
    step_windows,
)
from sparselift.analysis.trace import Trace

NODE_COLUMNS = [
    "node_id",
    *NODE_LABELS,
    "start_us",
    "end_us",
    "dur_s",
    "ids",
    "bytes",
    "x",
    "tables",
    "coll_key",
    "coll_op",
    "transfer_s",
    "skew_s",
]
MAIN_PARTS = ("compute", "wait", "idle")  # the main-thread parts, which tile a step
CONTEXT = ["stage", "phase", "module", "sharding"]


@dataclass
class Graph:
    """Nodes and edges of every rank and step, plus what could not be placed.

    Attributes:
        nodes: NODE_COLUMNS, one row per node (docs/CONTRACTS.md).
        edges: src, dst (node ids), kind (data, launch, wait, peer).
        steps: measured steps per rank: rank, step, start_us, end_us, dur_s (ProfilerStep).
        unplaced: one line per event or collective that could not be placed.
    """

    nodes: pd.DataFrame
    edges: pd.DataFrame
    steps: pd.DataFrame
    unplaced: list[str] = field(default_factory=list)


@dataclass
class RankNodes:
    """One rank's nodes (tables and x not yet attached), its measured steps, and what it could not
    place."""

    nodes: pd.DataFrame
    steps: pd.DataFrame
    unplaced: list[str] = field(default_factory=list)


@dataclass
class RankGraph:
    """One rank's share of the graph, made where the rank is analyzed (`rank_graph`).

    Attributes:
        rank: the rank.
        nodes: NODE_COLUMNS with tables and x, sorted by step and start and numbered from 0;
            transfer_s and skew_s NaN until collectives are paired across ranks (`merge_graph`).
        edges: the edges within the rank (`edges.rank_edges`), numbered like `nodes`.
        steps: its measured steps (rank, step, start_us, end_us, dur_s).
        unplaced: what it could not place.
    """

    rank: int
    nodes: pd.DataFrame
    edges: pd.DataFrame
    steps: pd.DataFrame
    unplaced: list[str] = field(default_factory=list)


def rank_nodes(tr: Trace, rank: int) -> RankNodes:
    """The nodes (NODE_COLUMNS, tables and x left empty) and measured steps of one rank.

    Args:
        tr: the rank's trace.
        rank: its rank, stamped on every row.
    """
    ev = tr.events
    thread = main_thread(ev)
    steps = step_windows(ev, thread)
    main = ev[
        (ev["pid"] == thread.pid)
        & (ev["tid"] == thread.tid)
        & ~ev["cat"].isin(("cuda_driver",))
        & ~ev["name"].str.match(names.STEP.pattern)
    ]
    main = annotate_stack(main.reset_index(drop=True))
    main["ids"] = lookup_ids(main)
    launched = launched_collectives(tr, main, thread)
    coll, problems = launched.events, launched.unplaced
    launch = coll["launch"].tolist()
    context = iter(main[CONTEXT].iloc[[i for i in launch if i >= 0]].to_numpy(dtype=object))
    coll_ctx = [
        [none_of(v) for v in next(context)] if i >= 0 else [None, "other", None, None]
        for i in launch
    ]
    coll[CONTEXT] = pd.DataFrame(coll_ctx, index=coll.index, columns=CONTEXT)
    coll["kind"] = [
        kind_of(s, p) if none_of(s) else ("dp_allreduce" if op == "all_reduce" else "dense_comm")
        for s, p, op in zip(coll["stage"], coll["phase"], coll["op"], strict=True)
    ]
    main_ts = main["ts"].to_numpy()
    coll["launch_ts"] = [
        main_ts[i] if i >= 0 else t for i, t in zip(launch, coll["ts"], strict=True)
    ]
    # (name, cat, stage, phase, module, sharding) per main-thread event, read once: per-cell
    # DataFrame access in the per-segment loop below is what made reconstruction slow
    labels = list(zip(*(main[c].tolist() for c in ("name", "cat", *CONTEXT)), strict=True))
    rows = []
    own: dict[Any, tuple[bool, tuple[Any, ...]]] = {}
    for st in steps.itertuples():
        segs = self_segments(main, st.start_us, st.end_us)
        in_step = (coll["launch_ts"] >= st.start_us) & (coll["launch_ts"] < st.end_us)
        c = coll[in_step].sort_values("launch_ts")
        thread_name = f"{thread.pid}/{thread.tid}"
        rows += main_rows(labels, segs, c, rank, st.step, thread_name, tr.is_cuda, own)
        for k, r in enumerate(c.itertuples()):
            rows.append(
                dict(
                    rank=rank,
                    step=st.step,
                    kind=r.kind,
                    stage=none_of(r.stage) or "dense",
                    phase=r.phase,
                    module=r.module,
                    sharding=r.sharding,
                    part="collective",
                    resource="network",
                    thread=f"{r.pid}/{r.tid}",
                    start_us=r.ts,
                    end_us=r.end,
                    dur_s=r.dur * 1e-6,
                    ids=0,
                    bytes=int(r.bytes),
                    coll_key=f"{st.step}.{k}",
                    coll_op=r.op,
                )
            )
    nodes = merge_same(fill_modules(pd.DataFrame(rows)))
    # ids looked up: the TBE forward's indices, serving its forward and its backward (and the
    # fused optimizer)
    lk = main[(main["ids"] > 0) & (main["stage"] == "lookup")]
    for st in steps.itertuples():
        w = lk[(lk["ts"] >= st.start_us) & (lk["ts"] < st.end_us)]
        for (mod, sh), v in w.groupby(["module", "sharding"], dropna=False)["ids"].sum().items():
            m = (
                (nodes["step"] == st.step)
                & nodes["kind"].isin(("lookup_fwd", "lookup_bwd"))
                & (nodes["part"] == "compute")
                & (nodes["module"].fillna("") == (mod or ""))
                & (nodes["sharding"].fillna("") == (sh or ""))
            )
            nodes.loc[m, "ids"] = int(v)
    unknown = main[
        (main["stage"].isna())
        & main["name"].str.contains(r"fbgemm::|All2All|all2all|ReduceScatter", regex=True)
        & ~main["name"].str.contains(r"fbgemm::(?:permute|asynchronous|bounds)", regex=True)
    ]
    for n in unknown["name"].unique()[:10]:
        problems.append(
            f"rank {rank}: sparse-looking op {n!r} outside any sparse stage (counted as dense)"
        )
    return RankNodes(nodes, steps.assign(rank=rank), problems)


def rank_graph(made: RankNodes, rank: int, plan_tables: pd.DataFrame | None) -> RankGraph:
    """One rank's share of the graph from its nodes (`rank_nodes`): tables and x attached, sorted
    by step and start, numbered from 0, with the edges within the rank.

    Args:
        made: the rank's nodes, steps and unplaced events (not modified).
        rank: its rank.
        plan_tables: the plan in force (`attach_tables`).
    """
    nodes = attach_tables(made.nodes.copy(), plan_tables)
    nodes = nodes.sort_values(["rank", "step", "start_us"], kind="stable").reset_index(drop=True)
    nodes["node_id"] = np.arange(len(nodes))
    nodes["transfer_s"] = np.nan
    nodes["skew_s"] = np.nan
    for c in NODE_COLUMNS:
        if c not in nodes:
            nodes[c] = None
    nodes = nodes[NODE_COLUMNS]
    src, dst, kinds = rank_edges(nodes)
    return RankGraph(rank, nodes, edge_frame(src, dst, kinds), made.steps, list(made.unplaced))


def merge_graph(parts: list[RankGraph]) -> Graph:
    """The ranks' shares (in rank order) as one Graph: nodes renumbered in rank order, the edges
    within ranks renumbered alike, collectives paired across ranks (`pair_collectives`) and their
    `peer` edges added (`peer_edges`).

    Only compact per-rank results are merged here: no trace event is needed.
    """
    offsets = np.cumsum([0, *(len(p.nodes) for p in parts)])
    nodes = pd.concat([p.nodes for p in parts], ignore_index=True)
    nodes["node_id"] = np.arange(len(nodes))
    steps = pd.concat([p.steps for p in parts], ignore_index=True)
    problems = [u for p in parts for u in p.unplaced]
    problems += pair_collectives(nodes)
    p_src, p_dst = peer_edges(nodes)
    own = [p.edges for p in parts]
    edges = edge_frame(
        np.concatenate(
            [e["src"].to_numpy(np.int64) + o for e, o in zip(own, offsets, strict=False)] + [p_src]
        ),
        np.concatenate(
            [e["dst"].to_numpy(np.int64) + o for e, o in zip(own, offsets, strict=False)] + [p_dst]
        ),
        [k for e in own for k in e["kind"].tolist()] + ["peer"] * len(p_src),
    )
    return Graph(nodes=nodes, edges=edges, steps=steps, unplaced=problems)


def build_graph(
    traces: list[Trace], plan_tables: pd.DataFrame | None = None, ranks: list[int] | None = None
) -> Graph:
    """Every rank's nodes with tables and x, collectives paired across ranks, and the edges.

    Args:
        traces: one per rank analyzed; a trace's `rank_nodes`, made in parallel where it was
            parsed, are used as they are.
        plan_tables: the plan in force, one row per shard (`profile.plan_tables`); None or empty:
            nodes get no tables and lookups no x.
        ranks: each trace's rank (None: index = rank).
    Returns:
        The Graph, nodes sorted by rank, step and start, numbered by `node_id`.
    """
    parts = []
    for r, tr in zip(ranks if ranks is not None else range(len(traces)), traces, strict=True):
        made = tr.rank_nodes
        one: RankNodes = made[1] if made is not None and made[0] == r else rank_nodes(tr, r)
        parts.append(rank_graph(one, r, plan_tables))
    return merge_graph(parts)


def attach_tables(nodes: pd.DataFrame, plan_tables: pd.DataFrame | None) -> pd.DataFrame:
    """Set each sparse node's `tables` (from the plan) and cost driver `x`, in place.

    A lookup node's tables are its rank's shards of its sharding type in its own module (where
    the plan names that module: one module's lookup does not look up another's tables).
    x: lookups ids · mean shard width (the fit replaces it with work units), distributions and
    data-parallel allreduces the collective's bytes. Returns `nodes`.
    """
    nodes["tables"] = ""
    nodes["x"] = 0.0
    if plan_tables is None or plan_tables.empty:
        return nodes
    planned_modules = set(plan_tables["module"].dropna()) if "module" in plan_tables else set()
    # one plan lookup per (sharding, rank, module) a node can ask for, not one per node
    per_key: dict[tuple[Any, Any, Any], tuple[str, float | None]] = {}
    tables, xs = nodes["tables"].tolist(), nodes["x"].tolist()
    cols = zip(
        nodes["stage"], nodes["sharding"], nodes["rank"], nodes["module"], nodes["ids"], strict=True
    )
    for i, (stage, sharding, rank, module, ids) in enumerate(cols):
        if stage not in names.SPARSE_STAGES:
            continue
        by_type = sharding if isinstance(sharding, str) and sharding != "*" else None
        own = module if stage == "lookup" and module in planned_modules else None
        key = (by_type, rank if stage == "lookup" else None, own)
        if key not in per_key:
            pt = plan_tables
            if by_type is not None:
                pt = pt[pt["sharding_type"] == by_type]
            if stage == "lookup":
                pt = pt[pt["rank"] == rank]
            if own is not None:
                pt = pt[pt["module"] == own]
            per_key[key] = (
                ",".join(sorted(pt["table"].unique())),
                float(pt["cols"].mean()) if len(pt) else None,
            )
        tables[i], width = per_key[key]
        if stage == "lookup" and width is not None:
            xs[i] = float(ids) * width
    nodes["tables"] = tables
    nodes["x"] = xs
    dist = nodes["stage"].isin(("input_dist", "output_dist"))
    nodes.loc[dist, "x"] = nodes.loc[dist, "bytes"].astype(float)
    dp = nodes["kind"] == "dp_allreduce"
    nodes.loc[dp, "x"] = nodes.loc[dp, "bytes"].astype(float)
    return nodes
