"""One rank's trace → the sparse path as nodes and edges, per step and sharded module.

The main (Python) thread is cut into self-time segments (each instant belongs to the innermost event
running there); each segment gets the sparse stage of its call stack (the outermost TorchRec
annotation wins; backward ops inherit their forward op's stage through the autograd sequence number),
or `dense`, or `idle`; segments where the thread sits in a wait while a collective is in flight are
exposed communication. Collectives themselves (gloo worker threads, NCCL kernels on streams) are
separate network nodes, paired with the main-thread op that launched them and, across ranks, by their
order within the step. So a step's main-thread nodes tile its measured time exactly, and what could
not be placed is counted rather than silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sparselift.analysis import names
from sparselift.analysis.trace import Trace, dims_of

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
MAIN_PARTS = ("compute", "wait", "idle")
GLOO_RUNS_AS = {
    "all_reduce": ("reduce_scatter",)
}  # gloo has no reduce-scatter: c10d runs an all-reduce


@dataclass
class Graph:
    """Nodes and edges of every rank and step, plus what could not be placed."""

    nodes: pd.DataFrame
    edges: pd.DataFrame
    steps: pd.DataFrame  # rank, step, start_us, end_us, dur_s (measured, ProfilerStep)
    unplaced: list[str] = field(default_factory=list)


def kind_of(stage: str | None, phase: str) -> str:
    """Contract op kinds: input_dist, lookup_fwd/bwd, output_dist_fwd/bwd, dense_<phase>."""
    if stage == "input_dist":
        return "input_dist"
    if stage in ("lookup", "output_dist"):
        return f"{stage}_{'bwd' if phase == 'bwd' else 'fwd'}"
    return f"dense_{phase}"


def main_thread(ev: pd.DataFrame) -> tuple[str, str]:
    """(pid, tid) of the thread that carries ProfilerStep#N annotations."""
    steps = ev[ev["name"].str.match(names.STEP.pattern)]
    if steps.empty:
        raise ValueError("no ProfilerStep#N events")
    pid, tid = steps[["pid", "tid"]].value_counts().index[0]
    return pid, tid


def step_windows(ev: pd.DataFrame, pid: str, tid: str) -> pd.DataFrame:
    s = ev[(ev["pid"] == pid) & (ev["tid"] == tid) & ev["name"].str.match(names.STEP.pattern)]
    out = pd.DataFrame(
        {
            "step": s["name"].str.extract(names.STEP.pattern)[0].astype(int).values,
            "start_us": s["ts"].values,
            "end_us": s["end"].values,
        }
    )
    out["dur_s"] = (out["end_us"] - out["start_us"]) * 1e-6
    return out.sort_values("start_us").reset_index(drop=True)


def annotate_stack(main: pd.DataFrame) -> pd.DataFrame:
    """Per main-thread event: stage, phase, module, sharding and depth from its call stack."""
    stage, phase, module, sharding, depth = [], [], [], [], []
    fwd_ctx: dict[int, tuple] = {}  # autograd sequence number → forward (stage, module, sharding)
    stack: list[tuple[float, tuple]] = []
    for name, ts, end, seq in zip(main["name"], main["ts"], main["end"], main["seq"]):
        while stack and stack[-1][0] <= ts:
            stack.pop()
        p_stage, p_phase, p_mod, p_sh = stack[-1][1] if stack else (None, "other", None, None)
        ph = p_phase
        if ph != "bwd" and names.BACKWARD.search(name):
            ph = "bwd"
        elif ph == "other" and (names.FORWARD_BLOCK.search(name) or names.stage_of(name)):
            ph = "fwd"
        st, mod, sh = p_stage, p_mod, p_sh
        if st is None:
            st = names.stage_of(name)
            if st is None and ph == "fwd" and names.INPUT_PERMUTE.search(name):
                st = "input_dist"
            if ph == "bwd" and seq is not pd.NA and seq is not None and int(seq) in fwd_ctx:
                st, mod, sh = (
                    fwd_ctx[int(seq)] if st is None or mod is None else (st, *fwd_ctx[int(seq)][1:])
                )
        m = names.TAGGED.match(name)
        if m and mod is None:
            mod, sh = m.group("module"), m.group("sharding")
        if ph == "fwd" and st is not None and seq is not pd.NA and seq is not None:
            fwd_ctx.setdefault(int(seq), (st, mod, sh))
        ctx = (st, ph, mod, sh)
        (
            stage.append(st),
            phase.append(ph),
            module.append(mod),
            sharding.append(sh),
            depth.append(len(stack)),
        )
        stack.append((end, ctx))
    out = main.copy()
    out["stage"], out["phase"], out["module"], out["sharding"], out["depth"] = (
        stage,
        phase,
        module,
        sharding,
        depth,
    )
    return out


def self_segments(main: pd.DataFrame, t0: float, t1: float) -> pd.DataFrame:
    """Disjoint [start, end) pieces of [t0, t1), each owned by its innermost event (-1: none)."""
    seg_s, seg_e, seg_i = [], [], []
    stack: list[tuple[float, int]] = []
    cur = t0

    def emit(a: float, b: float, i: int) -> None:
        if b > a:
            seg_s.append(a), seg_e.append(b), seg_i.append(i)

    w = main[(main["ts"] < t1) & (main["end"] > t0)]
    for i, ts, end in zip(w.index, w["ts"].clip(lower=t0), w["end"].clip(upper=t1)):
        while stack and stack[-1][0] <= ts:
            e, j = stack.pop()
            emit(cur, e, j)
            cur = max(cur, e)
        emit(cur, ts, stack[-1][1] if stack else -1)
        cur = max(cur, ts)
        end = min(end, stack[-1][0]) if stack else end  # children never outlive parents
        stack.append((end, i))
    while stack:
        e, j = stack.pop()
        emit(cur, e, j)
        cur = max(cur, e)
    emit(cur, t1, -1)
    return pd.DataFrame({"start": seg_s, "end": seg_e, "event": seg_i})


def collectives(
    tr: Trace, main: pd.DataFrame, pid: str, tid: str
) -> tuple[pd.DataFrame, list[str]]:
    """Collectives as executed, with the stage of the main-thread op that launched them."""
    ev = tr.events
    problems: list[str] = []
    is_coll = ev["name"].map(lambda n: bool(names.COLLECTIVE.search(n)))
    coll = ev[is_coll & ~((ev["pid"] == pid) & (ev["tid"] == tid))].copy()
    coll["op"] = coll["name"].map(names.collective_op)
    coll = coll[coll["op"] != "barrier"]
    launch = np.full(len(coll), -1)
    if tr.is_cuda:
        rt = ev[(ev["cat"] == "cuda_runtime") & ev["correlation"].notna()]
        corr_ts = dict(zip(rt["correlation"].astype(int), rt["ts"]))
        for k, c in enumerate(coll["correlation"]):
            if c is not pd.NA and int(c) in corr_ts:
                launch[k] = _enclosing(main, corr_ts[int(c)])
    else:
        c10d = main[main["name"].str.match(names.C10D.pattern)]
        c10d_ops = [
            (i, ts, names.collective_op(n))
            for i, ts, n in zip(c10d.index, c10d["ts"], c10d["name"])
        ]
        used: set[int] = set()
        for k, (ts, op) in enumerate(zip(coll["ts"], coll["op"])):
            cands = [
                i for i, lts, lop in c10d_ops if i not in used and lop == op and lts <= ts + 1.0
            ]
            if not cands:  # gloo runs some collectives as others (reduce_scatter → all_reduce)
                cands = [
                    i
                    for i, lts, lop in c10d_ops
                    if i not in used and lts <= ts + 1.0 and lop in GLOO_RUNS_AS.get(op, ())
                ]
            if cands:
                launch[k] = cands[0]  # launches run in order on their worker threads
                used.add(cands[0])
    coll["launch"] = launch
    for n in coll.loc[coll["launch"] < 0, "name"].unique():
        problems.append(f"collective {n!r}: launching op not found")
    sizes = []
    for dims, types, li in zip(coll["input_dims"], coll["input_types"], coll["launch"]):
        if not dims and li >= 0:
            dims, types = main.at[li, "input_dims"], main.at[li, "input_types"]
        sizes.append(_first_tensor_bytes(dims, types))
    coll["bytes"] = sizes
    return coll, problems


def _enclosing(main: pd.DataFrame, ts: float) -> int:
    """Index of the innermost main-thread event containing ts (-1: none)."""
    hit = main[(main["ts"] <= ts) & (main["end"] >= ts) & (main["cat"] != "cuda_runtime")]
    comm = hit[hit["name"].str.match(names.C10D.pattern)]  # the c10d op carries the shapes
    hit = comm if len(comm) else hit
    return int(hit["depth"].idxmax()) if len(hit) else -1


def _first_tensor_bytes(dims: str, types: str) -> int:
    d, t = dims_of(dims), dims_of(types)
    for k, x in enumerate(d):
        while isinstance(x, list) and x and isinstance(x[0], list):
            x = x[0]  # TensorList: its first tensor
        if isinstance(x, list) and x:
            elt = names.DTYPE_BYTES.get(t[k] if k < len(t) else "float", 4)
            return int(np.prod(x)) * elt
    return 0


def lookup_ids(main: pd.DataFrame) -> pd.Series:
    """Ids looked up per TBE forward call, from recorded shapes (bounds_check_indices or the TBE op)."""
    ids = pd.Series(0, index=main.index, dtype="int64")
    for i, name, dims in zip(main.index, main["name"], main["input_dims"]):
        if names.BOUNDS_CHECK.search(name):
            d = dims_of(dims)
            if len(d) > 1 and isinstance(d[1], list) and len(d[1]) == 1:
                ids[i] = d[1][0]
    if (ids > 0).any():
        return ids
    for i, name, dims in zip(main.index, main["name"], main["input_dims"]):
        if names.TBE_FWD.search(name):
            d = dims_of(dims)
            for a, b in zip(d, d[1:]):  # indices [N] then offsets [B*T+1]
                if _is_1d(a) and _is_1d(b) and b[0] % 2 == 1 and b[0] > 1 and a[0] >= b[0] - 1:
                    ids[i] = a[0]
                    break
    return ids


def _none(v):
    """pandas NaN/NA → None, so labels compare and group cleanly."""
    return None if v is None or (not isinstance(v, str) and pd.isna(v)) else v


def _is_1d(x) -> bool:
    return isinstance(x, list) and len(x) == 1 and isinstance(x[0], int)


def rank_nodes(tr: Trace, rank: int) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Nodes (see NODE_COLUMNS, tables left empty) and step windows of one rank."""
    ev = tr.events
    pid, tid = main_thread(ev)
    steps = step_windows(ev, pid, tid)
    main = ev[
        (ev["pid"] == pid)
        & (ev["tid"] == tid)
        & ~ev["cat"].isin(("cuda_driver",))
        & ~ev["name"].str.match(names.STEP.pattern)
    ]
    main = annotate_stack(main.reset_index(drop=True))
    main["ids"] = lookup_ids(main)
    coll, problems = collectives(tr, main, pid, tid)
    coll_ctx = [
        [_none(v) for v in main.loc[i, ["stage", "phase", "module", "sharding"]]]
        if i >= 0
        else [None, "other", None, None]
        for i in coll["launch"]
    ]
    coll[["stage", "phase", "module", "sharding"]] = pd.DataFrame(
        coll_ctx, index=coll.index, columns=["stage", "phase", "module", "sharding"]
    )
    coll["kind"] = [
        kind_of(s, p) if _none(s) else ("dp_allreduce" if op == "all_reduce" else "dense_comm")
        for s, p, op in zip(coll["stage"], coll["phase"], coll["op"])
    ]
    launch_ts = [main.at[i, "ts"] if i >= 0 else t for i, t in zip(coll["launch"], coll["ts"])]
    coll["launch_ts"] = launch_ts
    rows = []
    for st in steps.itertuples():
        segs = self_segments(main, st.start_us, st.end_us)
        c = coll[(coll["launch_ts"] >= st.start_us) & (coll["launch_ts"] < st.end_us)].sort_values(
            "launch_ts"
        )
        rows += _main_rows(main, segs, c, rank, st.step, f"{pid}/{tid}", tr.is_cuda)
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
    # ids looked up: the TBE forward's indices, serving its forward and its backward (and fused optimizer)
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
    return nodes, steps.assign(rank=rank), problems


def merge_same(nodes: pd.DataFrame) -> pd.DataFrame:
    """One main-thread node per (step, kind, module, sharding, part); collectives stay one each."""
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
    """Sparse nodes whose stack named no module (input-dist awaitables) take the step's only module
    and sharding for that stage when there is one; else `*` (they serve every sharding type)."""
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
    main: pd.DataFrame,
    segs: pd.DataFrame,
    coll: pd.DataFrame,
    rank: int,
    step: int,
    thread: str,
    cuda: bool = False,
) -> list[dict]:
    """Label each self-time segment, split at collective boundaries, then sum per label.

    On CPU (gloo) the Python thread blocks inside annotations and c10d ops while a collective runs;
    on CUDA it runs ahead of the device and only waits in explicit waits / synchronizations."""
    cuts = (
        np.unique(np.concatenate([coll["ts"].values, coll["end"].values]))
        if len(coll)
        else np.array([])
    )
    acc: dict[tuple, dict] = {}
    cstart, cend = coll["ts"].values, coll["end"].values
    for a, b, i in zip(segs["start"], segs["end"], segs["event"]):
        inner = cuts[(cuts > a) & (cuts < b)]
        bounds = [a, *inner, b]
        if i >= 0:
            name, cat = main.at[i, "name"], main.at[i, "cat"]
            stage, phase, mod, sh = (
                _none(main.at[i, c]) for c in ("stage", "phase", "module", "sharding")
            )
            waitable = bool(names.WAIT.search(name)) or (
                not cuda and (cat == "user_annotation" or bool(names.C10D.search(name)))
            )
        else:
            stage, phase, mod, sh, waitable = None, "other", None, None, not cuda
        for x, y in zip(bounds, bounds[1:]):
            mid = (x + y) / 2
            flying = np.nonzero((cstart <= mid) & (cend > mid))[0]
            if waitable and len(flying):
                c = coll.iloc[flying[0]]
                key = (
                    c["kind"],
                    c["stage"] or "dense",
                    c["phase"],
                    c["module"],
                    c["sharding"],
                    "wait",
                    "network",
                )
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


def build_graph(traces: list[Trace], plan_tables: pd.DataFrame | None = None) -> Graph:
    """All ranks: nodes with tables and x, cross-rank collective pairing, and data-dependency edges."""
    all_nodes, all_steps, problems = [], [], []
    for r, tr in enumerate(traces):
        n, st, p = rank_nodes(tr, r)
        all_nodes.append(n), all_steps.append(st), problems.extend(p)
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


def pair_collectives(nodes: pd.DataFrame) -> list[str]:
    """Pair each rank's k-th collective of a step with the other ranks'; fill transfer and skew.

    A collective ends together on every rank, so the rank that arrived last waited least: the
    smallest duration across ranks is the transfer itself, the rest of each rank's time is skew.
    """
    problems = []
    coll = nodes["part"] == "collective"
    nodes["transfer_s"] = np.nan
    nodes["skew_s"] = np.nan
    world = nodes["rank"].nunique()
    for key, g in nodes[coll].groupby("coll_key"):
        ops = g["coll_op"].unique()
        if g["rank"].nunique() != world:
            problems.append(
                f"collective {key} ({', '.join(ops)}) seen on ranks {sorted(g['rank'].unique())} only"
            )
        elif len(ops) > 1:
            problems.append(f"collective {key}: ranks disagree on the op ({', '.join(ops)})")
        t = g["dur_s"].min()
        nodes.loc[g.index, "transfer_s"] = t
        nodes.loc[g.index, "skew_s"] = g["dur_s"] - t
    return problems


def attach_tables(nodes: pd.DataFrame, plan_tables: pd.DataFrame | None) -> pd.DataFrame:
    """Tables each sparse node serves (from the plan) and its cost driver x (contract units)."""
    nodes["tables"] = ""
    nodes["x"] = 0.0
    if plan_tables is None or plan_tables.empty:
        return nodes
    for i, r in nodes.iterrows():
        if r["stage"] not in names.SPARSE_STAGES:
            continue
        pt = plan_tables
        if r["sharding"] not in (None, "*") and isinstance(r["sharding"], str):
            pt = pt[pt["sharding_type"] == r["sharding"]]
        if r["stage"] == "lookup":
            pt = pt[pt["rank"] == r["rank"]]
        nodes.at[i, "tables"] = ",".join(sorted(pt["table"].unique()))
        if r["stage"] == "lookup" and len(pt):
            nodes.at[i, "x"] = float(r["ids"]) * float(pt["cols"].mean())
    dist = nodes["stage"].isin(("input_dist", "output_dist"))
    nodes.loc[dist, "x"] = nodes.loc[dist, "bytes"].astype(float)
    dp = nodes["kind"] == "dp_allreduce"
    nodes.loc[dp, "x"] = nodes.loc[dp, "bytes"].astype(float)
    return nodes


STAGE_ORDER = ["input_dist", "lookup_fwd", "output_dist_fwd", "output_dist_bwd", "lookup_bwd"]


def build_edges(nodes: pd.DataFrame) -> pd.DataFrame:
    """Data dependencies along each module's sparse path, launch→collective→wait, and peer pairs."""
    rows = []
    sparse = nodes[nodes["kind"].isin(STAGE_ORDER)]
    for (rank, step, mod), g in sparse.groupby(["rank", "step", "module"], dropna=False):
        first = {}
        last = {}
        for k in STAGE_ORDER:
            s = g[g["kind"] == k].sort_values("start_us")
            if len(s):
                first[k], last[k] = s["node_id"].iloc[0], s["node_id"].iloc[-1]
        present = [k for k in STAGE_ORDER if k in first]
        for a, b in zip(present, present[1:]):
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
        for a, b in zip(ids, ids[1:]):
            rows.append((a, b, "peer"))
    return pd.DataFrame(rows, columns=["src", "dst", "kind"]).astype(
        {"src": "int64", "dst": "int64"}
    )
