"""Fitted cost coefficients per op kind (calibration.json, the optimizer's input).

duration_s ≈ a_s + b_s · x per op kind and call (units in docs/CONTRACTS.md), fitted on the quieter
half of the profiled steps. Distribution calls count the bytes each rank moves as the plan splits
them (`volumes`), the same count the optimizer's cost model uses, and are fitted on the rank that
waited least, so that waiting for a slow peer is not mistaken for bandwidth; what ranks arriving at
random add to each collective is priced apart, per call (`sync_s`). A profile sees about
one size per call, so each call's fixed cost comes from measuring that call on its own
(`kernels.CPU_CALL_S`) unless the profile's calls differ enough in size to tell. `overlap` is the
share of the stage's transfer hidden behind other work. `dense_step_s` is what is left of the fastest
measured step (slowest rank) when the sparse path's modelled cost is taken out, so predicting the
profiled plan gives back that step time."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sparselift.analysis.volumes import dist_bytes
from sparselift.errors import UserError

FORMAT = "sparselift-calibration"
VERSION = 1
UNITS = {
    "lookup_fwd": "work",
    "lookup_bwd": "work",
    "input_dist": "bytes",
    "output_dist_fwd": "bytes",
    "output_dist_bwd": "bytes",
    "dp_allreduce": "bytes",
}
DIST = ("input_dist", "output_dist_fwd", "output_dist_bwd")


@dataclass
class OpFit:
    x: str
    a_s: float  # fixed cost PER CALL: one sharding-type group's TBE kernel, or its distribution
    b_s: float  # seconds per unit of x
    r2: float
    n: int  # calls fitted on
    overlap: float = (
        0.0  # share of the collectives' transfer hidden behind other work (informative)
    )
    calls: float = 1.0  # calls per rank and step in the profile (sharding-type groups)
    sync_s: float = (
        0.0  # distributions: the step's expected wait per call for ranks arriving at random
    )

    def cost(self, x: float, calls: float = 1.0) -> float:
        """Exposed duration of `calls` calls that handle x in all (the fit is on exposed time)."""
        return max(0.0, (self.a_s + self.sync_s) * calls + self.b_s * x)


@dataclass
class Calibration:
    device: str
    backend: str | None
    world_size: int
    batch_size: int | None
    ops: dict[str, OpFit]
    dense_step_s: float
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "provenance": self.provenance,
            "device": self.device,
            "backend": self.backend,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "ops": {k: dataclasses.asdict(v) for k, v in self.ops.items()},
            "dense_step_s": self.dense_step_s,
        }


def _sent_bytes(coll: pd.DataFrame, world_size: int) -> pd.Series:
    """Bytes a collective sends off the rank, from its tensor size: an all-to-all keeps the rank's own
    chunk, a ring all-reduce (also gloo's stand-in for reduce-scatter) sends every other chunk twice
    (reduce, then gather), an all-gather sends its input to every peer — as the cost model counts."""
    w = max(world_size, 1)
    op = coll["coll_op"].fillna("")
    factor = np.where(
        op.str.contains("gather"),
        w - 1,
        np.where(op.str.contains("all_reduce"), 2 * (w - 1) / w, (w - 1) / w),
    )
    return coll["bytes"].astype(float) * factor


def lookup_work(
    nodes: pd.DataFrame,
    access: pd.DataFrame | None,
    plan_tables: pd.DataFrame,
    device: str,
    world_size: int,
) -> pd.Series:
    """Work units (`sparselift.kernels.lookup_work`) of each lookup node: its ids from the trace, and
    the distinct rows its tables' shards touch, expected from the profiled ids per table and their
    fitted Zipf skew (the trace does not say how many ids were distinct), and the pooled outputs its
    shards write (every rank's batch, but a data-parallel table's own)."""
    from sparselift.kernels import expected_unique
    from sparselift.kernels import lookup_work as work

    look = nodes[nodes["kind"].isin(("lookup_fwd", "lookup_bwd"))]
    if access is None or access.empty:
        return pd.Series(
            [
                work(k, device, i, 0.0, x / max(i, 1))
                for k, i, x in zip(look["kind"], look["ids"].fillna(0), look["x"].fillna(0))
            ],
            index=look.index,
        )
    per = access.groupby(["table", "rank"])["ids"].mean()
    total = per.groupby("table").sum()
    meta = access.groupby("table")[
        ["num_embeddings", "embedding_dim", "zipf_alpha", "batch_size"]
    ].first()
    shard = plan_tables.groupby(["table", "rank"]).agg(
        sharding_type=("sharding_type", "first"), rows=("rows", "sum"), cols=("cols", "sum")
    )
    out = []
    for idx, kind, rank, ids, x, tables in zip(
        look.index,
        look["kind"],
        look["rank"],
        look["ids"].fillna(0),
        look["x"].fillna(0),
        look["tables"].fillna(""),
    ):
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
                unique += expected_unique(n, alpha, float(per.get((t, rank), 0.0)))
            else:
                unique += expected_unique(n, alpha, float(total.get(t, 0.0))) * min(
                    1.0, float(rows) / n
                )
        out.append(work(kind, device, float(ids), unique, x / max(ids, 1), bag_elems))
    return pd.Series(out, index=look.index, dtype=float)


def call_samples(nodes: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """One sample per call: (rank, step, kind, group) with the call's x and exposed main-thread time y.

    A call is one sharding-type group's TBE kernel (lookups: y = its compute, x = its work units) or its
    distribution (input_dist: splits + lengths + values all-to-alls and permutes; output_dist: the
    pooled collective): y = compute + wait on the main thread, x = bytes its collectives send.
    Module-wide work outside any group (sharding "*") is spread over the step's groups.
    `transfer` is the collectives' transfer time (for the overlap share).
    """
    n = nodes[nodes["kind"].isin(("lookup_fwd", "lookup_bwd", *DIST))].copy()
    n["sharding"] = n["sharding"].fillna("*")
    n["sent"] = 0.0
    coll = n["part"] == "collective"
    n.loc[coll, "sent"] = _sent_bytes(n[coll], world_size)
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
            x = m["x"].sum() if kind.startswith("lookup") else c["sent"].sum()
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
                )
            )
    return pd.DataFrame(
        rows, columns=["rank", "step", "kind", "group", "x", "y", "wait", "transfer", "calls"]
    )


def _with_plan_bytes(calls: pd.DataFrame, sent: pd.DataFrame) -> pd.DataFrame:
    """Distribution calls' x: the bytes each rank moves as the plan splits them (`volumes`), where
    counted; the trace's even-split estimate elsewhere."""
    keys = ["rank", "step", "kind", "group"]
    m = calls.merge(sent.rename(columns={"x": "plan_x"}), on=keys, how="left")
    dist = m["kind"].isin(DIST) & m["plan_x"].notna()
    m.loc[dist, "x"] = m.loc[dist, "plan_x"]
    return m.drop(columns="plan_x")


def _fit_calls(x: np.ndarray, y: np.ndarray, fixed: float | None = None) -> tuple[float, float]:
    """(a, b) ≥ 0 through per-call samples, a ≤ min y.

    Where the calls' x differ (by > 20 %), a is the line's intercept (the smallest y when time does
    not grow with x), at most `fixed`. Where they do not, one size alone cannot tell a fixed cost from
    a per-unit one: a is `fixed`, the call's fixed cost measured on its own (`kernels.CPU_CALL_S`),
    or 0 without one. b takes the rest of the time per unit of x.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) == 0 or not np.any(x > 0):
        return (float(y.mean()) if len(y) else 0.0), 0.0
    cap = y.min() if fixed is None else min(fixed, y.min())
    a = 0.0 if fixed is None else cap
    if x.max() > 1.2 * x.min() > 0:
        b1, a1 = np.polyfit(x, y, 1)
        a = float(np.clip(a1 if b1 > 0 else y.min(), 0.0, cap))
    return float(a), max(0.0, float(((y - a) * x).sum() / (x * x).sum()))


def fit_ops(calls: pd.DataFrame, fixed: dict[str, float] | None = None) -> dict[str, OpFit]:
    """Per op kind: a_s per call, b_s per unit of x (`_fit_calls`, `fixed` the known per-call costs).

    Lookups: through the calls' medians per (rank, group): ranks and groups look up different
    amounts. Distributions: per (step, group), the exposed time of the rank that waited least (the
    last to arrive: it did not wait for a slow peer) against the most any rank moved — a collective
    ends together on every rank, so its time goes with the largest share.
    """
    ops = {}
    for kind, s in calls.groupby("kind"):
        prior = (fixed or {}).get(kind)
        if kind.startswith("lookup"):
            med = s.groupby(["rank", "group"])[["x", "y"]].median()
            a, b = _fit_calls(med["x"].values, med["y"].values, prior)
        else:
            by = s.groupby(["step", "group"])
            least = s.loc[by["wait"].idxmin()]
            a, b = _fit_calls(
                by["x"].transform("max").loc[least.index].values, least["y"].values, prior
            )
        pred = a + b * s["x"]
        ss = float(((s["y"] - s["y"].mean()) ** 2).sum())
        r2 = float(1 - ((s["y"] - pred) ** 2).sum() / ss) if ss > 0 else 1.0
        tr = s["transfer"].sum()
        overlap = (
            0.0
            if kind.startswith("lookup") or tr <= 0
            else float(np.clip(1 - s["wait"].sum() / tr, 0, 1))
        )
        ops[kind] = OpFit(
            x=UNITS.get(kind, "x"),
            a_s=a,
            b_s=float(b),
            r2=r2,
            n=int(len(s)),
            overlap=overlap,
            calls=float(s.groupby(["rank", "step"])["calls"].first().mean()),
            sync_s=0.0 if kind.startswith("lookup") else sync_wait(s),
        )
    return ops


def sync_wait(calls: pd.DataFrame) -> float:
    """What one collective adds to the step because ranks reach it at random moments (busy cores
    schedule each rank's threads late by a varying amount), per call: a sync point waits for the
    last rank. A rank's lateness at a call is its usual wait there (median over steps: the systematic
    imbalance, which the makespan prices already) minus this step's; the step pays the latest rank's
    lateness over the ranks' mean. Averaged over the profile's calls; 0 without ≥ 2 ranks and 3 steps."""
    out = []
    for _, g in calls.groupby("group"):
        w = g.pivot_table(index="step", columns="rank", values="wait")
        if w.shape[1] < 2 or len(w) < 3:
            continue
        late = w.median() - w
        out.append(float((late.max(axis=1) - late.mean(axis=1)).mean()))
    return float(np.mean(out)) if out else 0.0


def dp_allreduce_fit(nodes: pd.DataFrame) -> OpFit | None:
    """Per-byte transfer of the data-parallel gradient allreduces (the dense module's too): the median
    call's. A call of this size is a few gloo round trips, and a peer thread scheduled late makes one
    call several times slower; a mean over the few profiled calls would let one such call price every
    data-parallel table."""
    dp = nodes[
        (nodes["kind"] == "dp_allreduce") & (nodes["part"] == "collective") & (nodes["bytes"] > 0)
    ]
    if dp.empty:
        return None
    b = float((dp["transfer_s"].fillna(dp["dur_s"]) / dp["bytes"]).median())
    return OpFit(x=UNITS["dp_allreduce"], a_s=0.0, b_s=b, r2=0.0, n=int(len(dp)), overlap=0.0)


def sparse_cost(calls: pd.DataFrame, ops: dict[str, OpFit]) -> pd.Series:
    """Modelled sparse-path time per step as the optimizer's cost model composes it: per kind, the
    per-call costs of the groups present plus the slowest rank's per-unit work."""
    per = (
        calls.groupby(["step", "kind", "rank"])
        .agg(x=("x", "sum"), n=("group", "count"))
        .reset_index()
    )
    per["cost"] = [ops[k].cost(x, n) for k, x, n in zip(per["kind"], per["x"], per["n"])]
    return per.groupby(["step", "kind"])["cost"].max().groupby("step").sum()


def calibrate(
    nodes: pd.DataFrame,
    steps: pd.DataFrame,
    manifest: dict[str, Any],
    profile: str,
    access: pd.DataFrame | None = None,
    plan_tables: pd.DataFrame | None = None,
) -> Calibration:
    """Fit every op kind present; dense_step_s closes the measured step time."""
    world = int(manifest["world_size"])
    device = manifest.get("device") or "cpu"
    nodes = nodes.copy()
    look = nodes["kind"].isin(("lookup_fwd", "lookup_bwd"))
    if look.any():
        tables = (
            plan_tables
            if plan_tables is not None
            else pd.DataFrame(columns=["table", "module", "sharding_type", "rank", "rows", "cols"])
        )
        nodes.loc[look, "x"] = lookup_work(nodes[look], access, tables, device, world)
    by_step = steps.groupby("step")["dur_s"].max().to_frame("step_s")
    # fit on the quieter half of the steps: on a shared host, other processes only ever add time
    quiet = by_step.index[by_step["step_s"] <= by_step["step_s"].median()]
    nodes = nodes[nodes["step"].isin(quiet)]
    calls = call_samples(nodes, world)
    if calls.empty:
        raise UserError(f"{profile}: no sparse-path samples to calibrate on")
    if (
        access is not None
        and not access.empty
        and plan_tables is not None
        and not plan_tables.empty
    ):
        calls = _with_plan_bytes(calls, dist_bytes(access, plan_tables, manifest))
    from sparselift.kernels import CPU_CALL_S

    ops = fit_ops(calls, CPU_CALL_S if device == "cpu" else None)
    dp = dp_allreduce_fit(nodes)
    if dp is not None:
        ops["dp_allreduce"] = dp
    by_step["sparse"] = sparse_cost(calls, ops)
    by_step["sparse"] = by_step["sparse"].fillna(0.0)
    # the least-disturbed step: on a shared host, other processes only ever add time
    best = by_step["step_s"].idxmin()
    dense = float(by_step.at[best, "step_s"] - by_step.at[best, "sparse"])
    prov = {
        "profile": str(profile),
        "created_unix": time.time(),
        "manifest": {
            k: manifest.get(k)
            for k in (
                "versions",
                "workload",
                "world_size",
                "local_world_size",
                "device",
                "gpu",
                "backend",
                "batch_size",
                "pipeline",
                "profiled_steps",
            )
        },
        "samples": int(len(calls)),
        "step_time_s_median": float(by_step["step_s"].median()),
        "step_time_s_min": float(by_step["step_s"].min()),
    }
    return Calibration(
        device=device,
        backend=manifest.get("backend"),
        world_size=world,
        batch_size=manifest.get("batch_size"),
        ops=ops,
        dense_step_s=max(dense, 0.0),
        provenance=prov,
    )
