"""What the sparse-dist pipeline hides, measured from two profiles of one plan under each pipeline.

TorchRec's TrainPipelineSparseDist runs the next batch's input distribution beside this step's
compute. How much of it that hides depends on the hardware (on CPU there are no streams), so the
share is a coefficient to measure, not to assume: profile the same plan under the base pipeline
and under sparse-dist, and the difference of their steps, against the base profile's input_dist,
is the share hidden (net of the pipeline's own per-step overhead, which the cost model adds back).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sparselift.analysis.compare import after_window, check_same_job
from sparselift.analysis.evidence import MIN_STEADY_STEPS
from sparselift.analysis.profile import read_manifest
from sparselift.errors import UserError

BASE, SPARSE_DIST = "TrainPipelineBase", "TrainPipelineSparseDist"


@dataclass(frozen=True)
class PipelineOverlap:
    """The measured overlap and what it was computed from (seconds).

    Attributes:
        overlap: share of the base profile's input_dist the sparse-dist pipeline hides, in [0, 1].
        share: the same share as measured, before limiting it to [0, 1] (below 0: the pipeline
            made the step slower).
        input_dist_s: the base profile's input_dist per step (slowest rank, median).
        base_step_s, sparse_dist_step_s: median profiled step of each profile (slowest rank).
        overhead_s: the pipeline's per-step overhead the fit assumed (the cost model's).
        sparse_dist_profile: the sparse-dist profile directory.
    """

    overlap: float
    share: float
    input_dist_s: float
    base_step_s: float
    sparse_dist_step_s: float
    overhead_s: float
    sparse_dist_profile: str


def _profiled_step_s(profile: Path) -> float:
    """Median slowest-rank step: of the steps timed after the window where there are enough
    (they run as training does), else of the profiled window."""
    m = read_manifest(profile)
    after = after_window(m)
    if len(after) >= MIN_STEADY_STEPS:
        return statistics.median(after)
    warmup, n = int(m.get("warmup", 0)), len(m.get("profiled_steps") or [])
    per_rank = m.get("step_times_s") or []
    if not per_rank or n == 0:
        raise UserError(f"{profile / 'manifest.json'}: no profiled step times")
    steps = [max(float(r[i]) for r in per_rank) for i in range(warmup, warmup + n)]
    return statistics.median(steps)


def fit_pipeline_overlap(
    base_profile: str | Path,
    critical_path: pd.DataFrame,
    sparse_dist_profile: str | Path,
    overhead_s: float,
) -> PipelineOverlap:
    """Fit the share of input_dist the sparse-dist pipeline hides.

    Args:
        base_profile: a profile of the plan under the base pipeline.
        critical_path: its analysis's critical path (`Analysis.critical_path`).
        sparse_dist_profile: a profile of the same job and plan under sparse-dist.
        overhead_s: the pipeline's per-step overhead the cost model charges.
    Returns:
        The overlap (base step − sparse-dist step + overhead) ÷ input_dist, limited to [0, 1]:
        a pipeline measured slower hides nothing, and it cannot hide more than all of it.
    Raises:
        UserError: the profiles are of different jobs or plans, or not of the two pipelines.
    """
    base, sd = Path(base_profile), Path(sparse_dist_profile)
    check_same_job(base, sd)
    mb, ms = read_manifest(base), read_manifest(sd)
    if mb.get("pipeline") != BASE or ms.get("pipeline") != SPARSE_DIST:
        raise UserError(
            f"{base} and {sd}: need a {BASE} profile and a {SPARSE_DIST} one, got "
            f"{mb.get('pipeline')} and {ms.get('pipeline')}"
        )
    if mb.get("sharding") != ms.get("sharding"):
        raise UserError(f"{base} and {sd} profile different plans (their sharding differs)")
    per_step = critical_path[critical_path["kind"] == "input_dist"].groupby("step")["total_s"].sum()
    if per_step.empty or float(per_step.median()) <= 0:
        raise UserError(f"{base}: no input_dist on the critical path to measure an overlap on")
    input_dist = float(per_step.median())
    step_b, step_s = _profiled_step_s(base), _profiled_step_s(sd)
    share = (step_b - step_s + overhead_s) / input_dist
    return PipelineOverlap(
        overlap=min(1.0, max(0.0, share)),
        share=share,
        input_dist_s=input_dist,
        base_step_s=step_b,
        sparse_dist_step_s=step_s,
        overhead_s=overhead_s,
        sparse_dist_profile=str(sd),
    )
