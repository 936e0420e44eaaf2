"""Is a plan still right? Its statistics digest against a new profile, and what re-planning gains.

A plan records the table statistics it was made from (`statistics`, `planio.statistics_digest`).
`recheck` reads a new profile, lists the tables whose statistics moved by more than a tolerance
(where the plan has a digest: TorchRec's and round-robin plans have none, and are still checked),
prices the plan under the new statistics with the same cost model `optimize` plans with (the
plan's topology; the profile's calibration where it has one, as `optimize --profile`), and plans
again for the same statistics, topology, seed and workers. Re-planning starts from the plan and
never returns a worse one, so the gain is never negative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from sparselift import plans
from sparselift.errors import UserError
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.costs import PlanCost
from sparselift.optimizer.crowding import crowded_coefficients
from sparselift.optimizer.optimize import Inputs, Result, optimize
from sparselift.optimizer.planio import statistics_digest
from sparselift.optimizer.predict import predict_plan
from sparselift.optimizer.profile_input import read_profile
from sparselift.optimizer.split_options import split_options
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import PRESETS, Topology, load_topology, preset
from sparselift.plans.plan import STATISTICS_FIELDS

DRIFT_TOLERANCE = 0.20  # relative change of a digest field that counts as drift
DEFAULT_THRESHOLD = 0.05  # predicted gain of re-planning above which a plan is stale
NAMES_SHOWN = 5  # tables a refusal names before "(+N more)"


@dataclass(frozen=True)
class Drift:
    """One digest field of one table that moved by more than the tolerance.

    Attributes:
        table, field: which (`plans.plan.STATISTICS_FIELDS`).
        plan_value: the plan's digest value.
        profile_value: the new profile's.
        change: (profile_value - plan_value) / plan_value; inf where the plan's is 0.
    """

    table: str
    field: str
    plan_value: float
    profile_value: float
    change: float


@dataclass
class Recheck:
    """The verdict on one plan against one profile.

    Attributes:
        drifts: the fields beyond the tolerance, in model order, then field order; None where
            the plan records no digest to compare.
        tolerance: the relative change that counts as drift.
        predicted: the plan's cost under the profile's statistics.
        replanned: the planning run for those statistics (`replanned.cost`: its cost).
        gain: (predicted - re-planned step) / predicted step.
        threshold: the gain above which the plan is stale.
        topology: what both were priced on.
        batch_size: the profile's samples per rank.
        coefficients: where the cost coefficients came from (`Coefficients.source`).
        calibrated: whether the profile's calibration.json priced them.
    """

    drifts: list[Drift] | None
    tolerance: float
    predicted: PlanCost
    replanned: Result
    gain: float
    threshold: float
    topology: Topology
    batch_size: int
    coefficients: str
    calibrated: bool

    @property
    def stale(self) -> bool:
        """Whether re-planning is predicted to gain more than the threshold."""
        return self.gain > self.threshold


def drifts(
    plan_digest: dict[str, dict[str, float]],
    profile_digest: dict[str, dict[str, float]],
    tolerance: float = DRIFT_TOLERANCE,
) -> list[Drift]:
    """The digest fields whose relative change |new - old| / old is over `tolerance`.

    Args:
        plan_digest: the plan's `statistics`.
        profile_digest: `statistics_digest` of the new profile (same tables).
        tolerance: the relative change allowed.
    Returns:
        One Drift per field beyond it, tables in `plan_digest`'s order.
    """
    out = []
    for table, old in plan_digest.items():
        new = profile_digest.get(table)
        if new is None:
            continue
        for name in STATISTICS_FIELDS:
            a, b = float(old[name]), float(new[name])
            change = (b - a) / abs(a) if a else (0.0 if b == a else math.inf)
            if abs(change) > tolerance:
                out.append(Drift(table, name, a, b, change))
    return out


def same_tables(plan: plans.Plan, stats: list[TableStats], profile: str) -> None:
    """Refuse a profile of another model: other table names, or other sizes or weight types of
    the same tables.

    Raises:
        UserError: one line naming the first tables missing from the profile and not in the plan,
            or the first tables whose rows or dim differ, or whose weight types do.
    """
    ours = {t.name: t for t in plan.model}
    theirs = {s.name: s for s in stats}
    missing = [n for n in ours if n not in theirs]
    extra = [n for n in theirs if n not in ours]
    if missing or extra:
        parts = [
            f"{what}: {_first(names)}"
            for what, names in (
                ("missing from the profile", missing),
                ("not in the plan", extra),
            )
            if names
        ]
        raise UserError(
            f"{profile}: a profile of another model than {plan.source} ({'; '.join(parts)})"
        )
    resized = [
        f"{n} ({ours[n].num_embeddings}x{ours[n].embedding_dim} in the plan, "
        f"{theirs[n].num_embeddings}x{theirs[n].embedding_dim} profiled)"
        for n in ours
        if (ours[n].num_embeddings, ours[n].embedding_dim)
        != (theirs[n].num_embeddings, theirs[n].embedding_dim)
    ]
    if resized:
        raise UserError(
            f"{profile}: tables sized otherwise than in {plan.source}: {_first(resized)}"
        )
    retyped = [
        f"{n} ({ours[n].data_type} in the plan, {theirs[n].data_type} profiled)"
        for n in ours
        if ours[n].data_type != theirs[n].data_type
    ]
    if retyped:
        raise UserError(
            f"{profile}: tables whose weights are of another type than in {plan.source}: "
            f"{_first(retyped)}"
        )


def topology_of(plan: plans.Plan) -> Topology:
    """The topology `optimize` made the plan for: its preset at its ranks (cpu-gloo for a CPU
    plan that names none), or the topology file its provenance names (a plan made with
    `--topology FILE` without a preset).

    Raises:
        UserError: the plan names neither a preset nor a topology file that is still there, or
            the file no longer describes the plan's ranks and device.
    """
    t = plan.topology
    if t.preset in PRESETS:
        return preset(t.preset, t.world_size, t.local_world_size)
    if t.preset is None and t.device == "cpu":  # e.g. `plan from-torchrec`: CPU has one preset
        return preset("cpu-gloo", t.world_size, t.local_world_size)
    recorded = (plan.provenance or {}).get("topology")
    if isinstance(recorded, str) and recorded not in PRESETS and Path(recorded).is_file():
        topo = load_topology(recorded)
        if (topo.world_size, topo.local_world_size, topo.device) != (
            t.world_size,
            t.local_world_size,
            t.device,
        ):
            raise UserError(
                f"{plan.source}: its topology file {recorded} now describes other ranks or "
                "another device than the plan's"
            )
        return topo
    raise UserError(
        f"{plan.source}: the plan names no device preset or topology file to price it on "
        f"(preset {t.preset!r}, topology {recorded!r})"
    )


def recheck(
    plan: plans.Plan,
    profile: str | Path,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    tolerance: float = DRIFT_TOLERANCE,
    time_limit_s: float = 30.0,
) -> Recheck:
    """Check `plan` against the statistics of a new profile.

    Args:
        plan: a plan, with a statistics digest or without (then no drift is reported).
        profile: a profile directory (its manifest checked by the caller; calibration.json
            optional).
        threshold: the predicted gain of re-planning above which the plan is stale.
        tolerance: the relative change of a digest field that counts as drift.
        time_limit_s: the re-planning solve's seconds.
    Returns:
        The drifted fields, the plan's predicted cost, the re-planning run and the gain.
    Raises:
        UserError: the profile is unreadable or of another model; the plan's topology cannot be
            rebuilt.
    """
    prof = read_profile(profile, need_calibration=False)
    same_tables(plan, prof.stats, str(profile))
    topo = topology_of(plan)
    coeffs = coefficients(topo, prof.calibration)
    coeffs = crowded_coefficients(
        coeffs, profile, prof.plan_in_force, prof.stats, topo, prof.batch_size, prof.hot_ids
    )
    predicted = predict_plan(plan, prof.stats, coeffs, topo, prof.batch_size, prof.hot_ids)
    solver = plan.solver or {}
    seed, workers = solver.get("seed"), solver.get("workers")
    inputs = Inputs(
        prof.stats,
        topo,
        prof.batch_size,
        coeffs,
        {
            "profile": str(profile),
            "topology": topo.preset or (plan.provenance or {}).get("topology"),
        },
        split_options(prof.stats, topo.world_size, prof.hot_ids),
        prof.hot_ids or {},
    )
    replanned = optimize(
        inputs,
        time_limit_s=time_limit_s,
        seed=seed if isinstance(seed, int) else 0,
        workers=workers if isinstance(workers, int) and workers >= 1 else 1,
        baseline=plan,  # the warm start, and never handed back worse
    )
    step = predicted.step_time_s
    gain = (step - replanned.cost.step_time_s) / step if step > 0 else 0.0
    return Recheck(
        drifts=None
        if plan.statistics is None
        else drifts(plan.statistics, statistics_digest(prof.stats, prof.batch_size), tolerance),
        tolerance=tolerance,
        predicted=predicted,
        replanned=replanned,
        gain=gain,
        threshold=threshold,
        topology=topo,
        batch_size=prof.batch_size,
        coefficients=coeffs.source,
        calibrated=prof.calibration is not None,
    )


def _first(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown + (f" (+{len(names) - NAMES_SHOWN} more)" if len(names) > NAMES_SHOWN else "")
