"""What the sparse-dist pipeline hides, measured from two profiles of one plan under each pipeline.

TorchRec's TrainPipelineSparseDist runs the next batch's input distribution beside this step's
compute. How much of it that hides depends on the hardware (on CPU there are no streams), so the
share is a coefficient to measure, not to assume: profile the same plan under the base pipeline
and under sparse-dist, and the difference of their steps, against the base profile's input_dist,
is the share hidden (net of the pipeline's own per-step overhead, which the cost model adds back).
On a shared host two profiles' steps differ by noise as much as by the pipeline, so the share the
optimizer may count on is the one at the low end of a bootstrap interval of the steps' ratio
(`compare.compare_profiles`): a saving within the noise is not measured to pay.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sparselift.analysis.compare import check_same_job, compare_profiles
from sparselift.analysis.profile import read_manifest
from sparselift.errors import UserError

BASE, SPARSE_DIST = "TrainPipelineBase", "TrainPipelineSparseDist"
CONFIDENCE = 0.9  # two-sided: the low end is exceeded with 95 % probability


@dataclass(frozen=True)
class PipelineOverlap:
    """The measured overlap and what it was computed from (seconds).

    Attributes:
        overlap: share of the base profile's input_dist the sparse-dist pipeline is measured to
            hide at CONFIDENCE (`share_low` limited to [0, 1]): what the optimizer may count on.
        share: the share the median steps say, before limiting (below 0: the pipeline made the
            step slower).
        share_low: the share at the low end of the CONFIDENCE interval of the step ratio.
        input_dist_s: the base profile's input_dist per step (slowest rank, median).
        base_step_s, sparse_dist_step_s: median steady step of each profile (slowest rank;
            the profiled window's where too few steps were timed after it).
        overhead_s: the pipeline's per-step overhead the fit assumed (the cost model's).
        sparse_dist_profile: the sparse-dist profile directory.
    """

    overlap: float
    share: float
    share_low: float
    input_dist_s: float
    base_step_s: float
    sparse_dist_step_s: float
    overhead_s: float
    sparse_dist_profile: str


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
        The overlap (base step − sparse-dist step + overhead) ÷ input_dist, the steps' saving
        taken at the interval's low end and the share limited to [0, 1]: a pipeline not measured
        faster hides nothing, and it cannot hide more than all of it.
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
    verdict = compare_profiles(base, sd, confidence=CONFIDENCE)
    step_b, step_s = verdict.baseline.median_s, verdict.candidate.median_s
    share = (step_b - step_s + overhead_s) / input_dist
    share_low = (step_b - step_b / verdict.low + overhead_s) / input_dist
    return PipelineOverlap(
        overlap=min(1.0, max(0.0, share_low)),
        share=share,
        share_low=share_low,
        input_dist_s=input_dist,
        base_step_s=step_b,
        sparse_dist_step_s=step_s,
        overhead_s=overhead_s,
        sparse_dist_profile=str(sd),
    )
