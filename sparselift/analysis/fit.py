"""Fit the cost coefficients per op kind: the `Calibration` that calibration.json holds.

duration_s ≈ a_s + b_s · x per op kind and call (units in docs/CONTRACTS.md), fitted on the quieter
half of the profiled steps: on a shared host, other processes only ever add time. Distribution
calls are fitted on the rank that waited least, so that waiting for a slow peer is not mistaken for
bandwidth; what ranks arriving at random add to each collective is priced apart, per call
(`sync_s`). A profile sees about one size per call, so each call's fixed cost comes from measuring
that call on its own (`kernels.CPU_CALL_S`) unless the profile's calls differ enough in size to
tell; on CPU, calls of several plans can also refit the lookup unit's weights (`unit_fit`).
Row-wise and table-row-wise output distributions (a reduce-scatter) are their own kinds
(`step_model.with_rs_kinds`), priced like the all-to-all's where no profile ran them.
`dense_step_s` is what is left of the fastest measured step (slowest rank) when the sparse path's
modelled cost is taken out (`step_model`), so that predicting the profiled plan gives back that
step time; where profiles ran different numbers of model-parallel sharding types, what each type
adds to that residual is `type_overhead_s` (`type_overhead`), and `dense_step_s` the residual
without it.
The modelled sparse path includes how much later than predicted the slowest rank's lookups end
on average, at the rank spread the profiles measure (`rank_spread`), as the optimizer prices it.

A calibration is fitted from one profile or several of the same job (`fit_evidence`): each
profile's samples are gathered first (`evidence.profile_evidence`), then every op kind is fitted
on all of them together, and the dense step from the profiles' own (`step_model.dense_fit`).
Where profiles timed the split plans' batch transform, its fit over all their timings is
`batch_transform` (`transform_fit`); where they timed the split model's recombination,
`recombine` (`recombine_fit`); where they replicate different data-parallel weights, the
trainer's optimizer pass over them, `dense_optimizer` (`dense_backward.dense_optimizer_fit`).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from sparselift.analysis.dense_backward import (
    dense_backward,
    dense_optimizer_fit,
    dense_scale,
    dp_allreduce_fit,
    with_dense_scale,
)
from sparselift.analysis.evidence import ProfileEvidence
from sparselift.analysis.rank_spread import (
    lookup_rank_spread,
    lookups_by_rank,
)
from sparselift.analysis.recombine_fit import RECOMBINE, fit_recombine
from sparselift.analysis.samples import X_PARTS, lookup_work_of, n_calls_of
from sparselift.analysis.split_cost_fit import recombine_in_step, step_records, transform_in_step
from sparselift.analysis.step_model import dense_fit, with_rs_kinds
from sparselift.analysis.transform_fit import TRANSFORM, fit_transform
from sparselift.analysis.type_overhead import (
    profiled_sharding_types,
)
from sparselift.analysis.unit_fit import MAX_REL_SE, refit_unit
from sparselift.calibration import (
    DENSE_OPTIMIZER,
    RS_KIND,
    UNITS,
    Calibration,
    OpFit,
    Provenance,
)
from sparselift.kernels import CPU_CALL_S, KERNEL_UNIT, LookupUnit

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
    "missing_ranks",
)


class LineFit(NamedTuple):
    """duration = a_s + b_s · x, both ≥ 0."""

    a_s: float
    b_s: float


def call_priors(device: str) -> dict[str, float] | None:
    """Known per-call fixed costs by kind (`kernels.CPU_CALL_S` on CPU, None elsewhere); the
    reduce-scatter kinds take their all-to-all's, the only call of the kind measured on its own."""
    if device != "cpu":
        return None
    return {**CPU_CALL_S, **{rs: CPU_CALL_S[a2a] for a2a, rs in RS_KIND.items()}}


def _fit_calls(x: Any, y: Any, fixed: float | None = None) -> LineFit:
    """A line through per-call samples (x, y), with a ≤ min y.

    Where the calls' x differ (by > 20 %), a is the line's intercept (the smallest y when time does
    not grow with x), at most `fixed` unless the samples determine it (its standard error within
    `unit_fit.MAX_REL_SE` of it: then at most the smallest y). Where they do not, one size alone
    cannot tell a fixed cost from a per-unit one: a is `fixed`, the call's fixed cost measured on
    its own (`kernels.CPU_CALL_S`), or 0 without one. b takes the rest of the time per unit of x.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) == 0 or not np.any(x > 0):
        return LineFit((float(y.mean()) if len(y) else 0.0), 0.0)
    cap = y.min() if fixed is None else min(fixed, y.min())
    a = 0.0 if fixed is None else cap
    if x.max() > 1.2 * x.min() > 0:
        b1, a1 = np.polyfit(x, y, 1)
        if b1 > 0 and a1 > 0 and len(x) >= 4:
            cov = np.polyfit(x, y, 1, cov=True)[1]
            if np.sqrt(max(cov[1, 1], 0.0)) <= MAX_REL_SE * a1:
                cap = y.min()  # determined by the samples: the prior does not bound it
        a = float(np.clip(a1 if b1 > 0 else y.min(), 0.0, cap))
    return LineFit(float(a), max(0.0, float(((y - a) * x).sum() / (x * x).sum())))


def fit_ops(
    calls: pd.DataFrame, fixed: dict[str, float] | None = None, device: str = "cpu"
) -> dict[str, OpFit]:
    """Fit each op kind present in `calls`: a_s per call, b_s per unit of x.

    A sample that adds up several collections' calls (`n_calls`) is fitted as their mean call.
    Lookups are fitted through the calls' medians per (profile, rank, group): ranks and groups
    look up different amounts. The backward of data-parallel groups (the dense TBE, no fused
    optimizer) is left out of lookup_bwd's line and measured against it (`dense_scale`). On CPU,
    where those calls determine the unit's weights
    (`unit_fit.refit_unit`), x is recounted in the refitted unit. Distributions: per (profile,
    step, group), the exposed time of the rank that waited least (the last to arrive: it did not
    wait for a slow peer) against the most any rank moved; a collective ends together on every
    rank, so its time goes with the largest share.

    Args:
        calls: per-call samples (`samples.call_samples`), with a `profile` column when they come
            from several profiles.
        fixed: known per-call fixed costs by kind (`kernels.CPU_CALL_S` on CPU), or None.
        device: the profiled device ("cpu" or "cuda"; the lookup unit is refitted on CPU only).
    Returns:
        An OpFit per kind, with its r2, sample count, overlap share, (distributions) sync_s,
        (refitted lookups) unique_weight / bag_weight and (lookup_bwd beside data-parallel
        groups) dense_scale.
    """
    calls = calls if "profile" in calls else calls.assign(profile=0)
    ops = {}
    for kind, samples in calls.groupby("kind"):
        prior = (fixed or {}).get(kind)
        lookup = kind.startswith("lookup")
        weights: tuple[float | None, float | None, float | None] = (None, None, None)
        one = per_call(samples)
        dense = dense_backward(samples) if kind == "lookup_bwd" else None
        if dense is not None and (dense.all() or not dense.any()):
            dense = None  # no fused group to fit the line on, or no dense one to measure
        if dense is not None:  # the fused kernels' line, without the dense groups
            one = per_call(samples[~dense])
        if lookup:
            cols = ["x", "y", *X_PARTS]
            med = one.groupby(["profile", "rank", "group"])[cols].median()
            unit = refit_unit(med, *KERNEL_UNIT.weights(kind)) if device == "cpu" else None
            if unit is not None:
                weights = (unit.kappa, unit.mu, unit.phi)
                refitted = _unit_with(kind, *weights)
                samples = samples.assign(
                    x=lookup_work_of(samples, samples["kind"], "cpu", refitted)
                )
                line = LineFit(min(unit.a_s, float(med["y"].min())), unit.b_s)
            else:
                line = _fit_calls(med["x"].values, med["y"].values, prior)
        else:
            by_call = one.groupby(["profile", "step", "group"])
            least = one.loc[by_call["wait"].idxmin()]
            most_moved = by_call["x"].transform("max").loc[least.index]
            line = _fit_calls(most_moved.values, least["y"].values, prior)
        scale = None
        if dense is not None:
            scale = dense_scale(per_call(samples[dense]), line.a_s, line.b_s)
            samples = with_dense_scale(samples, scale)
        y = samples["y"]
        predicted = line.a_s * n_calls_of(samples) + line.b_s * samples["x"]
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
            calls=float(samples.groupby(["profile", "rank", "step"])["calls"].first().mean()),
            sync_s=0.0 if lookup else sync_wait(one),
            unique_weight=weights[0],
            bag_weight=weights[1],
            footprint_weight=weights[2],
            dense_scale=scale,
        )
    return ops


def per_call(calls: pd.DataFrame) -> pd.DataFrame:
    """`calls` with each sample's sizes and times as its mean call's (`n_calls`): a sample of
    one collection is itself."""
    n = n_calls_of(calls)
    if (n == 1).all():
        return calls
    out = calls.copy()
    cols = [c for c in ("x", "y", "wait", "transfer", *X_PARTS) if c in out]
    out[cols] = out[cols].div(n, axis=0)
    return out


def _unit_with(kind: str, kappa: float | None, mu: float | None, phi: float | None) -> LookupUnit:
    """The kernel's unit with kind's κ, μ and φ replaced where refitted."""
    k0, m0 = KERNEL_UNIT.weights(kind)
    k, m = k0 if kappa is None else kappa, m0 if mu is None else mu
    f = KERNEL_UNIT.footprint(kind) if phi is None else phi
    if kind == "lookup_fwd":
        return LookupUnit(unique_fwd=k, bag_fwd=m, footprint_fwd=f)
    return LookupUnit(unique_bwd=k, bag_bwd=m, footprint_bwd=f)


def sync_wait(calls: pd.DataFrame) -> float:
    """Seconds one collective adds to the step because ranks reach it at random moments, per call.

    Busy cores schedule each rank's threads late by a varying amount, and a sync point waits for
    the last rank. A rank's lateness at a call is its usual wait there (median over steps: the
    steady imbalance, which the makespan prices already) minus this step's; the step pays the
    latest rank's lateness over the ranks' mean.

    Args:
        calls: one op kind's samples (`group`, `step`, `rank`, `wait` columns; `profile` when
            they come from several profiles).
    Returns:
        The mean over (profile,) groups and steps; 0 without at least 2 ranks and 3 steps.
    """
    out = []
    keys = ["profile", "group"] if "profile" in calls else ["group"]
    for _, g in calls.groupby(keys):
        w = g.pivot_table(index="step", columns="rank", values="wait")
        if w.shape[1] < 2 or len(w) < 3:
            continue
        late = w.median() - w
        out.append(float((late.max(axis=1) - late.mean(axis=1)).mean()))
    return float(np.mean(out)) if out else 0.0


def transform_fit_of(evidence: list[ProfileEvidence]) -> OpFit | None:
    """The batch transform's fit over every profile's timings together, scaled to what split
    plans' steps measured where any did (`split_cost_fit`); None without any timing."""
    fit = fit_transform([s for ev in evidence for s in ev.transform])
    return transform_in_step(fit, [ev.manifest for ev in evidence])


def recombine_fit_of(evidence: list[ProfileEvidence]) -> OpFit | None:
    """The recombination's fit over every profile's timings together, scaled as the transform's
    (`split_cost_fit`); None without any timing."""
    fit = fit_recombine([s for ev in evidence for s in ev.recombine])
    return recombine_in_step(fit, [ev.manifest for ev in evidence])


def fit_evidence(evidence: list[ProfileEvidence]) -> Calibration:
    """Fit one calibration on one or several profiles of the same job.

    Every op kind is fitted on all profiles' calls together (reduce-scatter output distributions
    as their own kinds, `with_rs_kinds`); the dense step and the per-type overhead from each
    profile's residual (`dense_fit`): the dense part is the same model in every plan.

    Args:
        evidence: `evidence.profile_evidence` of each profile (the first names the calibration).
    Returns:
        The Calibration (its provenance stamped with the current time, listing every profile).
    """
    first = evidence[0]
    calls = pd.concat(
        [with_rs_kinds(ev.calls).assign(profile=i) for i, ev in enumerate(evidence)],
        ignore_index=True,
    )
    ops = fit_ops(calls, call_priors(first.device), first.device)
    dp = dp_allreduce_fit(pd.concat([ev.dp for ev in evidence]))
    if dp is not None:
        ops["dp_allreduce"] = dp
    optimizer = dense_optimizer_fit(evidence)
    if optimizer is not None:
        ops[DENSE_OPTIMIZER] = optimizer
    tx = transform_fit_of(evidence)
    if tx is not None:
        ops[TRANSFORM] = tx
    rc = recombine_fit_of(evidence)
    if rc is not None:
        ops[RECOMBINE] = rc
    spread = lookup_rank_spread([lookups_by_rank(ev.calls, ops, ev.device) for ev in evidence])
    dense = dense_fit(evidence, [ops] * len(evidence), spread)
    provenance = Provenance(
        profile=first.profile,
        created_unix=time.time(),
        manifest={
            **{k: first.manifest.get(k) for k in MANIFEST_FIELDS},
            "sharding_types": profiled_sharding_types(ev.manifest for ev in evidence),
        },
        samples=int(len(calls)),
        step_time_s_median=float(first.step_s.median()),
        step_time_s_min=float(first.step_s.min()),
        steady_step_s_median=first.steady_step_s,
        profiler_inflation=first.inflation,
        profiles=[ev.profile for ev in evidence] if len(evidence) > 1 else [],
    )
    return Calibration(
        device=first.device,
        backend=first.manifest.get("backend"),
        world_size=first.world_size,
        batch_size=first.manifest.get("batch_size"),
        ops=ops,
        dense_step_s=dense.dense_step_s,
        provenance=provenance,
        type_overhead_s=dense.type_overhead_s,
        lookup_rank_spread=spread,
        split_cost_profiles=[ev.profile for ev in evidence if step_records([ev.manifest])]
        if tx is not None or rc is not None
        else [],
    )
