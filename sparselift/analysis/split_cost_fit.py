"""A split model's own costs as its steps paid them: the stand-alone fits, scaled.

The batch transform and the recombination are fitted on the profiler's stand-alone timings
(`transform_fit`, `recombine_fit`): every profile has them, so a split can be priced before any
profile has run one. Where a profiled plan had splits, its steady steps timed the same two costs
as the step ran them (the manifest's `split_cost_s`, `profiler.split_timer`). The fit keeps its
shape (seconds per split feature and per id routed; per pooled element read and written) and is
scaled by the median, over those steps, of the time measured ÷ the time the fit prices for
that step's features, ids and elements: the measurement of the cost a split plan will pay.

Pure numpy, as the fits it scales.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sparselift.calibration import OpFit

# a step's record in `split_cost_s` (`profiler.split_timer.SPLIT_COST_FIELDS`)
TRANSFORM_S, FEATURES, IDS, RECOMBINE_S, READ, WRITTEN = range(6)


def step_records(manifests: Sequence[dict[str, Any]]) -> list[list[float]]:
    """Every rank's steady-step records of the manifests' `split_cost_s` (none where absent)."""
    return [
        list(r)
        for m in manifests
        for rank in (m.get("split_cost_s") or [])
        for r in rank or []
        if len(r) > WRITTEN
    ]


def median_step_costs(manifest: dict[str, Any]) -> tuple[float, float] | None:
    """A split plan's profile's batch transform and recombination seconds a step: the medians
    over every rank's steady steps; None for a profile without them (a plan without splits)."""
    records = step_records([manifest])
    if not records:
        return None
    transform, recombine = (
        float(np.median([r[k] for r in records])) for k in (TRANSFORM_S, RECOMBINE_S)
    )
    return transform, recombine


def scaled(
    fit: OpFit | None, records: list[list[float]], seconds: int, priced: Callable[..., float]
) -> OpFit | None:
    """`fit` with a_s and b_s times the median of record[seconds] ÷ priced(fit, record) over the
    records the fit prices above 0; `fit` itself without such records."""
    if fit is None:
        return None
    ratios = [r[seconds] / p for r in records if (p := priced(fit, r)) > 0 and r[seconds] >= 0]
    if not ratios:
        return fit
    k = float(np.median(ratios))
    return dataclasses.replace(fit, a_s=fit.a_s * k, b_s=fit.b_s * k)


def transform_in_step(fit: OpFit | None, manifests: Sequence[dict[str, Any]]) -> OpFit | None:
    """The batch transform's fit scaled to what the steps of split plans measured."""
    return scaled(
        fit,
        step_records(manifests),
        TRANSFORM_S,
        lambda f, r: f.a_s * r[FEATURES] + f.b_s * r[IDS],
    )


def recombine_in_step(fit: OpFit | None, manifests: Sequence[dict[str, Any]]) -> OpFit | None:
    """The recombination's fit scaled to what the steps of split plans measured."""
    return scaled(
        fit, step_records(manifests), RECOMBINE_S, lambda f, r: f.b_s * (r[READ] + r[WRITTEN])
    )
