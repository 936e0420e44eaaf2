"""Fit the cost coefficients per op kind: the `Calibration` that calibration.json holds.

duration_s ≈ a_s + b_s · x per op kind and call (units in docs/CONTRACTS.md), fitted on the quieter
half of the profiled steps: on a shared host, other processes only ever add time. Distribution
calls are fitted on the rank that waited least, so that waiting for a slow peer is not mistaken for
bandwidth; what ranks arriving at random add to each collective is priced apart, per call
(`sync_s`). A profile sees about one size per call, so each call's fixed cost comes from measuring
that call on its own (`kernels.CPU_CALL_S`) unless the profile's calls differ enough in size to
tell. `dense_step_s` is what is left of the fastest measured step (slowest rank) when the sparse
path's modelled cost is taken out, so that predicting the profiled plan gives back that step time.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from sparselift.analysis.samples import (
    LOOKUPS,
    call_samples,
    lookup_work_per_node,
    with_plan_bytes,
)
from sparselift.analysis.volumes import dist_bytes
from sparselift.calibration import UNITS, Calibration, OpFit, Provenance
from sparselift.errors import UserError
from sparselift.kernels import CPU_CALL_S

# the manifest fields a calibration carries along (optimize reads the hardware from them)
MANIFEST_FIELDS = (
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
PLAN_TABLE_COLUMNS = ["table", "module", "sharding_type", "rank", "rows", "cols"]


class LineFit(NamedTuple):
    """duration = a_s + b_s · x, both ≥ 0."""

    a_s: float
    b_s: float


def _fit_calls(x: Any, y: Any, fixed: float | None = None) -> LineFit:
    """A line through per-call samples (x, y), with a ≤ min y.

    Where the calls' x differ (by > 20 %), a is the line's intercept (the smallest y when time does
    not grow with x), at most `fixed`. Where they do not, one size alone cannot tell a fixed cost
    from a per-unit one: a is `fixed`, the call's fixed cost measured on its own
    (`kernels.CPU_CALL_S`), or 0 without one. b takes the rest of the time per unit of x.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) == 0 or not np.any(x > 0):
        return LineFit((float(y.mean()) if len(y) else 0.0), 0.0)
    cap = y.min() if fixed is None else min(fixed, y.min())
    a = 0.0 if fixed is None else cap
    if x.max() > 1.2 * x.min() > 0:
        b1, a1 = np.polyfit(x, y, 1)
        a = float(np.clip(a1 if b1 > 0 else y.min(), 0.0, cap))
    return LineFit(float(a), max(0.0, float(((y - a) * x).sum() / (x * x).sum())))


def fit_ops(calls: pd.DataFrame, fixed: dict[str, float] | None = None) -> dict[str, OpFit]:
    """Fit each op kind present in `calls`: a_s per call, b_s per unit of x.

    Lookups are fitted through the calls' medians per (rank, group): ranks and groups look up
    different amounts. Distributions: per (step, group), the exposed time of the rank that waited
    least (the last to arrive: it did not wait for a slow peer) against the most any rank moved; a
    collective ends together on every rank, so its time goes with the largest share.

    Args:
        calls: per-call samples (`samples.call_samples`).
        fixed: known per-call fixed costs by kind (`kernels.CPU_CALL_S` on CPU), or None.
    Returns:
        An OpFit per kind, with its r2, sample count, overlap share and (distributions) sync_s.
    """
    ops = {}
    for kind, samples in calls.groupby("kind"):
        prior = (fixed or {}).get(kind)
        lookup = kind.startswith("lookup")
        if lookup:
            med = samples.groupby(["rank", "group"])[["x", "y"]].median()
            line = _fit_calls(med["x"].values, med["y"].values, prior)
        else:
            by_call = samples.groupby(["step", "group"])
            least = samples.loc[by_call["wait"].idxmin()]
            most_moved = by_call["x"].transform("max").loc[least.index]
            line = _fit_calls(most_moved.values, least["y"].values, prior)
        y = samples["y"]
        predicted = line.a_s + line.b_s * samples["x"]
        spread = float(((y - y.mean()) ** 2).sum())
        r2 = float(1 - ((y - predicted) ** 2).sum() / spread) if spread > 0 else 1.0
        transfer = samples["transfer"].sum()
        overlap = (
            0.0
            if lookup or transfer <= 0
            else float(np.clip(1 - samples["wait"].sum() / transfer, 0, 1))
        )
        ops[kind] = OpFit(
            x=UNITS.get(kind, "x"),
            a_s=line.a_s,
            b_s=float(line.b_s),
            r2=r2,
            n=int(len(samples)),
            overlap=overlap,
            calls=float(samples.groupby(["rank", "step"])["calls"].first().mean()),
            sync_s=0.0 if lookup else sync_wait(samples),
        )
    return ops


def sync_wait(calls: pd.DataFrame) -> float:
    """Seconds one collective adds to the step because ranks reach it at random moments, per call.

    Busy cores schedule each rank's threads late by a varying amount, and a sync point waits for
    the last rank. A rank's lateness at a call is its usual wait there (median over steps: the
    steady imbalance, which the makespan prices already) minus this step's; the step pays the
    latest rank's lateness over the ranks' mean.

    Args:
        calls: one op kind's samples (`group`, `step`, `rank`, `wait` columns).
    Returns:
        The mean over groups and steps; 0 without at least 2 ranks and 3 steps.
    """
    out = []
    for _, g in calls.groupby("group"):
        w = g.pivot_table(index="step", columns="rank", values="wait")
        if w.shape[1] < 2 or len(w) < 3:
            continue
        late = w.median() - w
        out.append(float((late.max(axis=1) - late.mean(axis=1)).mean()))
    return float(np.mean(out)) if out else 0.0


def dp_allreduce_fit(nodes: pd.DataFrame) -> OpFit | None:
    """Per-byte transfer of the data-parallel gradient allreduces (the dense module's too).

    The median call's, not the mean: a call of this size is a few gloo round trips, and a peer
    thread scheduled late makes one call several times slower; a mean over the few profiled calls
    would let one such call price every data-parallel table.

    Args:
        nodes: graph nodes (`kind`, `part`, `bytes`, `transfer_s`, `dur_s` columns).
    Returns:
        The fit (a_s = 0), or None when the profile has no such call.
    """
    dp = nodes[
        (nodes["kind"] == "dp_allreduce") & (nodes["part"] == "collective") & (nodes["bytes"] > 0)
    ]
    if dp.empty:
        return None
    b = float((dp["transfer_s"].fillna(dp["dur_s"]) / dp["bytes"]).median())
    return OpFit(x=UNITS["dp_allreduce"], a_s=0.0, b_s=b, r2=0.0, n=int(len(dp)), overlap=0.0)


def sparse_cost(calls: pd.DataFrame, ops: dict[str, OpFit]) -> pd.Series:
    """Modelled sparse-path seconds per step, composed as the optimizer's cost model does.

    Per kind: the per-call costs of the groups present plus the per-unit work, on the slowest rank.

    Args:
        calls: per-call samples.
        ops: the fits of every kind in `calls`.
    Returns:
        Seconds, indexed by step.
    """
    per = (
        calls.groupby(["step", "kind", "rank"])
        .agg(x=("x", "sum"), n=("group", "count"))
        .reset_index()
    )
    per["cost"] = [
        ops[k].cost(x, n) for k, x, n in zip(per["kind"], per["x"], per["n"], strict=True)
    ]
    return per.groupby(["step", "kind"])["cost"].max().groupby("step").sum()


def calibrate(
    nodes: pd.DataFrame,
    steps: pd.DataFrame,
    manifest: dict[str, Any],
    profile_dir: str,
    access: pd.DataFrame | None = None,
    plan_tables: pd.DataFrame | None = None,
) -> Calibration:
    """Fit every op kind present in a profile; dense_step_s closes the measured step time.

    Args:
        nodes: graph nodes (`reconstruct.build_graph`).
        steps: measured step windows per rank (rank, step, dur_s).
        manifest: the profile's manifest (world_size, device, backend, batch_size, tables, …).
        profile_dir: the profile directory, for messages and the provenance.
        access: the profile's access statistics, if recorded.
        plan_tables: the plan in force, one row per shard.
    Returns:
        The Calibration (its provenance stamped with the current time).
    Raises:
        UserError: the quieter steps have no sparse-path call to fit on.
    """
    world = int(manifest["world_size"])
    device = manifest.get("device") or "cpu"
    nodes = nodes.copy()
    look = nodes["kind"].isin(LOOKUPS)
    if look.any():
        tables = (
            plan_tables if plan_tables is not None else pd.DataFrame(columns=PLAN_TABLE_COLUMNS)
        )
        nodes.loc[look, "x"] = lookup_work_per_node(nodes[look], access, tables, device, world)
    by_step = steps.groupby("step")["dur_s"].max().to_frame("step_s")
    quiet = by_step.index[by_step["step_s"] <= by_step["step_s"].median()]
    nodes = nodes[nodes["step"].isin(quiet)]
    calls = call_samples(nodes, world)
    if calls.empty:
        raise UserError(f"{profile_dir}: no sparse-path samples to calibrate on")
    if (
        access is not None
        and not access.empty
        and plan_tables is not None
        and not plan_tables.empty
    ):
        calls = with_plan_bytes(calls, dist_bytes(access, plan_tables, manifest))
    ops = fit_ops(calls, CPU_CALL_S if device == "cpu" else None)
    dp = dp_allreduce_fit(nodes)
    if dp is not None:
        ops["dp_allreduce"] = dp
    by_step["sparse"] = sparse_cost(calls, ops)
    by_step["sparse"] = by_step["sparse"].fillna(0.0)
    # the least-disturbed step: on a shared host, other processes only ever add time
    best = by_step["step_s"].idxmin()
    dense = float(by_step.at[best, "step_s"] - by_step.at[best, "sparse"])
    provenance = Provenance(
        profile=str(profile_dir),
        created_unix=time.time(),
        manifest={k: manifest.get(k) for k in MANIFEST_FIELDS},
        samples=int(len(calls)),
        step_time_s_median=float(by_step["step_s"].median()),
        step_time_s_min=float(by_step["step_s"].min()),
    )
    return Calibration(
        device=device,
        backend=manifest.get("backend"),
        world_size=world,
        batch_size=manifest.get("batch_size"),
        ops=ops,
        dense_step_s=max(dense, 0.0),
        provenance=provenance,
    )
