"""Ranks that share cores: the step of a plan on a crowded host, fitted from its profiled plan.

The cost model takes each rank to run on a core of its own, so a lighter rank's wait at a
collective is idle time and evening out the ranks' loads shortens the step. Where a host's
ranks outnumber its cores (its profile's manifest says so, `profile_manifest.crowded_host`),
a rank that waits gives its core to another rank: the step is bounded below by the work of all
the ranks that share the cores, so evening out their loads buys little, and only less work
shortens the step.

The model keeps that as one factor, `Coefficients.crowd_factor`: a step lasts at least
crowd_factor × the mean rank's work (its dense step, lookups and collectives, as
`cost_model.mean_rank_work_s` sums them). The factor is fitted from the profiled plan: its
predicted step (which the calibration fits to its measured one) over its mean rank's work, so
the profiled plan keeps its predicted step and another plan is predicted no faster than its
share of that work.
"""

from __future__ import annotations

from pathlib import Path

from sparselift import plans
from sparselift.optimizer.coefficients import MEASURED, Coefficients
from sparselift.optimizer.cost_model import mean_rank_work_s
from sparselift.optimizer.predict import predict_plan
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.profile_manifest import crowded_host, read_manifest
from sparselift.profiler.hot_ids import HotIds


def crowded_coefficients(
    coeffs: Coefficients,
    profile: str | Path,
    plan: plans.Plan | None,
    stats: list[TableStats],
    topo: Topology,
    batch_size: int,
    hot: dict[str, HotIds] | None = None,
) -> Coefficients:
    """`coeffs` with `crowd_factor` fitted where profile `profile`'s ranks shared cores.

    Args:
        coeffs: the calibrated coefficients (their crowd_factor is replaced).
        profile: the profile directory whose manifest says whether its host was crowded.
        plan: the plan that profile trained with (None: not known, then `coeffs` as they are).
        stats, topo, batch_size, hot: as the plan is priced (`predict.predict_plan`).
    Returns:
        `coeffs` unchanged where the profile's ranks each had a core or its plan is unknown;
        else with crowd_factor = the plan's predicted step ÷ its mean rank's work, marked
        measured from `profile`.
    Raises:
        UserError: the manifest is unreadable, or the plan cannot be priced on `stats`.
    """
    if plan is None or crowded_host(read_manifest(profile)) is None:
        return coeffs
    uncrowded = coeffs.replace(crowd_factor=0.0)
    cost = predict_plan(plan, stats, uncrowded, topo, batch_size, hot)
    work = mean_rank_work_s(cost.per_rank)
    if work <= 0:
        return coeffs
    factor = cost.step_time_s / work
    return coeffs.replace(crowd_factor=factor).with_evidence(
        MEASURED, str(profile), ("crowd_factor",)
    )
