"""Every rank's trace → the sparse path as a graph of nodes and edges, per step and module.

A step's main thread is cut into self-time segments (`stack`); each gets the sparse stage of its
call stack, or `dense`, or `idle`, and segments where the thread sits in a wait while a collective
is in flight are exposed communication. Collectives themselves (gloo worker threads, NCCL kernels
on streams) are separate network nodes, paired with the main-thread op that launched them and,
across ranks, by their order within the step (`collectives`). So a step's main-thread nodes tile
its measured time exactly, and what could not be placed is counted rather than silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sparselift.analysis import names
from sparselift.analysis.collectives import launched_collectives, pair_collectives
from sparselift.analysis.edges import build_edges
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
    "rank",
    "step",
    "kind",
    "stage",
    "phase",
    "module",
    "sharding",
    "part",
    "resource",
    "thread",
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


def kind_of(stage: str | None, phase: str) -> str:
    """Contract op kinds: input_dist, lookup_fwd/bwd, output_dist_fwd/bwd, dense_<phase>."""
    if stage == "input_dist":
        return "input_dist"
    if stage in ("lookup", "output_dist"):
        return f"{stage}_{'bwd' if phase == 'bwd' else 'fwd'}"
    return f"dense_{phase}"


def _none(v: Any) -> Any:
    """pandas NaN/NA → None, so labels compare and group cleanly."""
    return None if v is None or (not isinstance(v, str) and pd.isna(v)) else v


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
    coll_ctx = [
        [_none(v) for v in main.loc[i, CONTEXT]] if i >= 0 else [None, "other", None, None]
        for i in coll["launch"]
    ]
    coll[CONTEXT] = pd.DataFrame(coll_ctx, index=coll.index, columns=CONTEXT)
    coll["kind"] = [
        kind_of(s, p) if _none(s) else ("dp_allreduce" if op == "all_reduce" else "dense_comm")
        for s, p, op in zip(coll["stage"], coll["phase"], coll["op"], strict=True)
    ]
    coll["launch_ts"] = [
        main.at[i, "ts"] if i >= 0 else t for i, t in zip(coll["launch"], coll["ts"], strict=True)
    ]
    # (name, cat, stage, phase, module, sharding) per main-thread event, read once: per-cell
    # DataFrame access in the per-segment loop below is what made reconstruction slow
    labels = list(zip(*(main[c].tolist() for c in ("name", "cat", *CONTEXT)), strict=True))
    rows = []
    for st in steps.itertuples():
        segs = self_segments(main, st.start_us, st.end_us)
        in_step = (coll["launch_ts"] >= st.start_us) & (coll["launch_ts"] < st.end_us)
        c = coll[in_step].sort_values("launch_ts")
        thread_name = f"{thread.pid}/{thread.tid}"
        rows += _main_rows(labels, segs, c, rank, st.step, thread_name, tr.is_cuda)
        for k, r in enumerate(c.itertuples()):
            rows.append(
                dict(
                    rank=rank,
                    step=st.step,
                    kind=r.kind,
                    stage=_none(r.stage) or "dense",
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


def merge_same(nodes: pd.DataFrame) -> pd.DataFrame:
    """One main-thread node per (step, kind, module, sharding, part); collectives stay one each.

    A merged node spans its pieces' first start to last end and sums their durations, ids and
    bytes.
    """
    coll = nodes[nodes["part"] == "collective"]
    m = nodes[nodes["part"] != "collective"]
    keys = [
        "rank",
        "step",
        "kind",
        "stage",
        "phase",
        "module",
        "sharding",
        "part",
        "resource",
        "thread",
    ]
    g = (
        m.groupby(keys, dropna=False, sort=False)
        .agg(
            start_us=("start_us", "min"),
            end_us=("end_us", "max"),
            dur_s=("dur_s", "sum"),
            ids=("ids", "sum"),
            bytes=("bytes", "sum"),
        )
        .reset_index()
    )
    g["coll_key"], g["coll_op"] = None, None
    return pd.concat([g, coll], ignore_index=True)


def fill_modules(nodes: pd.DataFrame) -> pd.DataFrame:
    """Give sparse nodes whose stack named no module (input-dist awaitables) one, in place.

    They take the step's only module, and its input_dist's only sharding type, when there is one;
    else `*` (they serve every module or sharding type). Returns `nodes`.
    """
    sparse = nodes["stage"].isin(names.SPARSE_STAGES)
    for (step,), g in nodes[sparse].groupby(["step"]):
        known = g[g["module"].notna()]
        mods = known["module"].unique()
        shs = known[known["stage"] == "input_dist"]["sharding"].dropna().unique()
        if len(mods) == 0:
            continue
        miss = sparse & (nodes["step"] == step) & nodes["module"].isna()
        nodes.loc[miss, "module"] = mods[0] if len(mods) == 1 else "*"
        miss_sh = sparse & (nodes["step"] == step) & nodes["sharding"].isna()
        nodes.loc[miss_sh, "sharding"] = shs[0] if len(shs) == 1 else "*"
    return nodes


def _main_rows(
    labels: list[tuple[Any, ...]],
    segs: pd.DataFrame,
    coll: pd.DataFrame,
    rank: int,
    step: int,
    thread: str,
    cuda: bool = False,
) -> list[dict[str, Any]]:
    """Label each self-time segment, split at collective boundaries, then sum per label.

    `labels[i]` is main-thread event i's (name, cat, stage, phase, module, sharding).

    On CPU (gloo) the Python thread blocks inside annotations and c10d ops while a collective runs;
    on CUDA it runs ahead of the device and only waits in explicit waits / synchronizations.
    """
    cuts = (
        np.unique(np.concatenate([coll["ts"].values, coll["end"].values]))
        if len(coll)
        else np.array([])
    )
    acc: dict[tuple[Any, ...], dict[str, float]] = {}
    cstart, cend = coll["ts"].values, coll["end"].values
    wait_keys = list(
        zip(
            *(coll[c].tolist() for c in ("kind", "stage", "phase", "module", "sharding")),
            strict=True,
        )
    )
    for a, b, i in zip(segs["start"], segs["end"], segs["event"], strict=True):
        inner = cuts[(cuts > a) & (cuts < b)]
        bounds = [a, *inner, b]
        if i >= 0:
            name, cat, *context = labels[i]
            stage, phase, mod, sh = (_none(v) for v in context)
            waitable = bool(names.WAIT.search(name)) or (
                not cuda and (cat == "user_annotation" or bool(names.C10D.search(name)))
            )
        else:
            stage, phase, mod, sh, waitable = None, "other", None, None, not cuda
        for x, y in zip(bounds, bounds[1:], strict=False):
            mid = (x + y) / 2
            flying = np.nonzero((cstart <= mid) & (cend > mid))[0]
            if waitable and len(flying):
                c_kind, c_stage, c_phase, c_mod, c_sh = wait_keys[flying[0]]
                key = (c_kind, c_stage or "dense", c_phase, c_mod, c_sh, "wait", "network")
            elif i < 0:
                key = ("idle", "idle", "other", None, None, "idle", "idle")
            elif stage is not None:
                res = "compute" if stage == "lookup" else "memory"
                key = (kind_of(stage, phase), stage, phase, mod, sh, "compute", res)
            else:
                key = (kind_of(None, phase), "dense", phase, None, None, "compute", "compute")
            r = acc.setdefault(key, dict(start_us=x, end_us=y, dur_s=0.0))
            r["start_us"], r["end_us"] = min(r["start_us"], x), max(r["end_us"], y)
            r["dur_s"] += (y - x) * 1e-6
    rows = []
    for (kind, stage, phase, mod, sh, part, res), r in acc.items():
        rows.append(
            dict(
                rank=rank,
                step=step,
                kind=kind,
                stage=stage,
                phase=phase,
                module=mod,
                sharding=sh,
                part=part,
                resource=res,
                thread=thread,
                ids=0,
                bytes=0,
                coll_key=None,
                coll_op=None,
                **r,
            )
        )
    return rows


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
    all_nodes, all_steps, problems = [], [], []
    for r, tr in zip(ranks if ranks is not None else range(len(traces)), traces, strict=True):
        made = tr.rank_nodes
        one: RankNodes = made[1] if made is not None and made[0] == r else rank_nodes(tr, r)
        all_nodes.append(one.nodes)
        all_steps.append(one.steps)
        problems.extend(one.unplaced)
    nodes = pd.concat(all_nodes, ignore_index=True)
    steps = pd.concat(all_steps, ignore_index=True)
    problems += pair_collectives(nodes)
    nodes = attach_tables(nodes, plan_tables)
    nodes = nodes.sort_values(["rank", "step", "start_us"], kind="stable").reset_index(drop=True)
    nodes["node_id"] = np.arange(len(nodes))
    for c in NODE_COLUMNS:
        if c not in nodes:
            nodes[c] = None
    nodes = nodes[NODE_COLUMNS]
    return Graph(nodes=nodes, edges=build_edges(nodes), steps=steps, unplaced=problems)


def attach_tables(nodes: pd.DataFrame, plan_tables: pd.DataFrame | None) -> pd.DataFrame:
    """Set each sparse node's `tables` (from the plan) and cost driver `x`, in place.

    x: lookups ids · mean shard width (the fit replaces it with work units), distributions and
    data-parallel allreduces the collective's bytes. Returns `nodes`.
    """
    nodes["tables"] = ""
    nodes["x"] = 0.0
    if plan_tables is None or plan_tables.empty:
        return nodes
    # one plan lookup per (sharding, rank) a node can ask for, not one per node
    per_key: dict[tuple[Any, Any], tuple[str, float | None]] = {}
    tables, xs = nodes["tables"].tolist(), nodes["x"].tolist()
    cols = zip(nodes["stage"], nodes["sharding"], nodes["rank"], nodes["ids"], strict=True)
    for i, (stage, sharding, rank, ids) in enumerate(cols):
        if stage not in names.SPARSE_STAGES:
            continue
        by_type = sharding if isinstance(sharding, str) and sharding != "*" else None
        key = (by_type, rank if stage == "lookup" else None)
        if key not in per_key:
            pt = plan_tables
            if by_type is not None:
                pt = pt[pt["sharding_type"] == by_type]
            if stage == "lookup":
                pt = pt[pt["rank"] == rank]
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
