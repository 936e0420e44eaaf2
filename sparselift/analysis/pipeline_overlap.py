"""What the sparse-dist pipeline hides, and what it costs, measured from two profiles of one plan.

TorchRec's TrainPipelineSparseDist runs the next batch's input distribution beside this step's
compute. How much of it that hides depends on the hardware (on CPU there are no streams), so the
share is a coefficient to measure, not to assume; and the pipeline's own per-step cost (its
extra bookkeeping and copies) is another. Profile the same plan under the base pipeline and
under sparse-dist; then two measurements tell them apart:

* *hidden*: the base profile's input_dist per step on the critical path, less what of the
  sparse-dist profile's input_dist still runs on its main thread. That part is read from the
  sparse-dist trace itself: TorchRec wraps the pipelined input distribution in three annotations
  (`PIPELINE_INPUT_DIST`: the launch of the next batch's splits, the wait for them that launches
  its data all-to-alls, and the forward's wait for this batch's data), and with gloo the
  transfers run on gloo's threads in between, so the main thread's time inside them is the
  input_dist left exposed. (The graph's wait nodes cannot say it: a sparse-dist step's backward
  runs while the next batch's all-to-all is in flight, and its waits are labelled with that.)
* *overhead*: the step difference that hiding does not explain, sparse-dist step − base step
  + hidden, never below 0.

Window times (input_dist, its exposed part) are scaled to the steady step by each profile's
profiler inflation, as the calibration's samples are (`evidence.scaled_to_steady`). The overlap
the cost model prices with is the share the trace shows hidden, and the net saving it prices
(hidden − overhead) is the measured step difference (`compare.compare_profiles`: round by round
where the two were profiled side by side), never more than the trace shows hidden:
the best estimate, so that plans under either pipeline are predicted alike. Whether the
pipeline may be chosen is a separate verdict: on a shared host two profiles' steps differ by
noise as much as by the pipeline, so it *pays* only where the step difference at the low end of
a bootstrap interval of the steps' ratio (`compare.compare_profiles`) is a saving, and the trace
shows more hidden than the overhead: a pipeline not measured faster is not chosen.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from sparselift.analysis.compare import check_same_job, compare_profiles, spanning
from sparselift.analysis.evidence import window_inflation
from sparselift.analysis.names import PIPELINE_INPUT_DIST
from sparselift.analysis.profile import open_profile, read_manifest
from sparselift.analysis.stack import main_thread, step_windows
from sparselift.analysis.trace import load_trace
from sparselift.calibration import Calibration
from sparselift.errors import UserError

if TYPE_CHECKING:  # the pipeline module imports the analysis stages this one sits beside
    from sparselift.analysis.pipeline import Analysis

BASE, SPARSE_DIST = "TrainPipelineBase", "TrainPipelineSparseDist"
CONFIDENCE = 0.9  # two-sided: the low end is exceeded with 95 % probability


@dataclass(frozen=True)
class PipelineOverlap:
    """The pipeline's measured overlap and overhead, and what they were computed from (seconds;
    window times scaled to the steady step).

    Measured: `hidden_s` (from both traces), `overhead_s` (from both profiles' steps and
    `hidden_s`), and `overlap`, the coefficient the optimizer uses with `overhead_s`; the rest is
    what they were computed from.

    Attributes:
        overlap: share of input_dist the pipeline hides, hidden ÷ input_dist: the cost model's
            coefficient. overlap · input_dist − overhead is the net saving priced: the measured
            step difference, no more than hidden.
        pays: whether the pipeline may be chosen: the net saving at the low end of the
            CONFIDENCE interval (`share_low`) is above 0.
        share: (base step − sparse-dist step + overhead) ÷ input_dist, the measured share
            before limiting (below 0: the pipeline made the step slower).
        share_low: the same with the step saving at the low end of the CONFIDENCE interval, and
            the saving no more than hidden − overhead.
        input_dist_s: the base profile's input_dist per step on the critical path (slowest
            rank, median).
        exposed_s: the sparse-dist profile's input_dist per step left on its main thread (the
            slowest rank's time in `PIPELINE_INPUT_DIST`, median).
        hidden_s: input_dist − exposed, limited to [0, input_dist].
        overhead_s: sparse-dist step − base step + hidden, at least 0: what the pipeline costs
            per step beyond what it hides.
        base_step_s: the base profile's median steady step (slowest rank; the profiled
            window's where too few steps were timed after it).
        sparse_dist_step_s: the base step ÷ the measured ratio (`compare_profiles`: paired
            round by round where both were profiled side by side, else the median step).
        saving_low_s, saving_high_s: the CONFIDENCE interval of base step − sparse-dist step.
        base_profile, sparse_dist_profile: the two profile directories.
    """

    overlap: float
    pays: bool
    share: float
    share_low: float
    input_dist_s: float
    exposed_s: float
    hidden_s: float
    overhead_s: float
    base_step_s: float
    sparse_dist_step_s: float
    saving_low_s: float
    saving_high_s: float
    base_profile: str
    sparse_dist_profile: str

    @property
    def profiles(self) -> list[str]:
        """The two profiles, base first: where the overlap and overhead were measured."""
        return [self.base_profile, self.sparse_dist_profile]


def exposed_input_dist(profile: str | Path, cache: bool = True) -> pd.DataFrame:
    """Per profiled step of a sparse-dist profile, the slowest rank's input_dist left on its
    main thread: the time inside TorchRec's `PIPELINE_INPUT_DIST` annotations (overlaps merged).

    Args:
        profile: a TrainPipelineSparseDist profile directory.
        cache: read and write the parsed-trace cache beside the traces.
    Returns:
        step, rank (the slowest, by ProfilerStep duration; the first of equals), step_s,
        input_dist_s; one row per step, in step order.
    Raises:
        UserError: not a profile, a trace missing or bad, or no rank's steps hold any of the
            annotations (not TorchRec's sparse-dist pipeline, or a TorchRec that names them
            otherwise).
    """
    files = open_profile(profile)
    rows = []
    for rank, path in zip(files.ranks, files.paths, strict=True):
        ev = load_trace(path, cache=cache).events
        try:
            thread = main_thread(ev)
        except ValueError:
            raise UserError(f"{path}: no ProfilerStep#N events (not a step trace)") from None
        steps = step_windows(ev, thread)
        on = ev[(ev["pid"] == thread.pid) & (ev["tid"] == thread.tid)]
        marks = on[on["name"].str.match(PIPELINE_INPUT_DIST.pattern)]
        for st in steps.itertuples():
            rows.append((st.step, rank, st.dur_s, _inside(marks, st.start_us, st.end_us)))
    out = pd.DataFrame(rows, columns=["step", "rank", "step_s", "input_dist_s"])
    if not (out["input_dist_s"] > 0).any():
        raise UserError(
            f"{files.path}: no sparse-dist input_dist on any rank's main thread (TorchRec's "
            "## start_sparse_data_dist ##, ## wait_sparse_data_dist ## and "
            "## runtime_forward_assemble_KJT ## annotations): not a profile of that pipeline"
        )
    top = out.loc[out.groupby("step", sort=True)["step_s"].idxmax()]
    return top.reset_index(drop=True)


def _inside(marks: pd.DataFrame, t0: float, t1: float) -> float:
    """Seconds of [t0, t1) (µs) covered by the events `marks` (ts, end), overlaps counted once."""
    w = marks[(marks["end"] > t0) & (marks["ts"] < t1)]
    if w.empty:
        return 0.0
    starts, ends = np.maximum(w["ts"], t0).tolist(), np.minimum(w["end"], t1).tolist()
    spans = sorted(zip(starts, ends, strict=True))
    total, (a, b) = 0.0, spans[0]
    for x, y in spans[1:]:
        if x > b:
            total, a = total + (b - a), x
        b = max(b, y)
    return (total + (b - a)) * 1e-6


def overlap_of(
    input_dist_s: float,
    exposed_s: float,
    base_step_s: float,
    sparse_dist_step_s: float,
    saving_low_s: float,
) -> tuple[float, bool, float, float, float, float]:
    """The pipeline's coefficients from what the two profiles measured (seconds).

    Args:
        input_dist_s: the base profile's input_dist per step (> 0).
        exposed_s: the sparse-dist profile's input_dist left on its main thread.
        base_step_s, sparse_dist_step_s: the two median steps.
        saving_low_s: base step − sparse-dist step at the low end of their interval.
    Returns:
        (overlap, pays, share, share_low, hidden_s, overhead_s) as `PipelineOverlap` defines
        them: hidden limited to [0, input_dist], the overhead to ≥ 0; the net saving priced
        (overlap · input_dist − overhead) is the measured saving, no more than hidden; the
        pipeline pays where the saving at the interval's low end, no more than hidden −
        overhead, is above 0.
    """
    hidden = min(input_dist_s, max(0.0, input_dist_s - exposed_s))
    saving = base_step_s - sparse_dist_step_s
    overhead = max(0.0, hidden - saving)
    net_low = min(saving_low_s, hidden - overhead)
    share = (saving + overhead) / input_dist_s
    share_low = (net_low + overhead) / input_dist_s
    return hidden / input_dist_s, net_low > 0, share, share_low, hidden, overhead


def fit_pipeline_overlap(
    base: Analysis,
    sparse_dist_profile: str | Path,
    cache: bool = True,
    models: Sequence[str | Path] = (),
) -> PipelineOverlap:
    """Measure the share of input_dist the sparse-dist pipeline hides, and its overhead.

    Args:
        base: the analysis (`pipeline.analyze`) of a profile of the plan under the base
            pipeline; its critical path gives input_dist, its evidence the profiler inflation.
        sparse_dist_profile: a profile of the same job and plan under sparse-dist.
        cache: read and write the sparse-dist traces' parse cache.
        models: other profiles of the plan under base in the same side-by-side job (other
            models of it): the saving's interval spans the verdict against each
            (`compare.spanning`), so the pipeline pays only where it beats every model.
    Returns:
        The PipelineOverlap (`overlap_of`).
    Raises:
        UserError: the profiles are of different jobs or plans, not of the two pipelines, the
            base one has no input_dist on its critical path, or the sparse-dist one none of the
            pipeline's input_dist annotations (`exposed_input_dist`).
    """
    b, sd = Path(base.calibration.provenance.profile or ""), Path(sparse_dist_profile)
    check_same_job(b, sd)
    mb, ms = read_manifest(b), read_manifest(sd)
    if mb.get("pipeline") != BASE or ms.get("pipeline") != SPARSE_DIST:
        raise UserError(
            f"{b} and {sd}: need a {BASE} profile and a {SPARSE_DIST} one, got "
            f"{mb.get('pipeline')} and {ms.get('pipeline')}"
        )
    if mb.get("sharding") != ms.get("sharding"):
        raise UserError(f"{b} and {sd} profile different plans (their sharding differs)")
    cp = base.critical_path
    per_step = cp[cp["kind"] == "input_dist"].groupby("step")["total_s"].sum()
    if per_step.empty or float(per_step.median()) <= 0:
        raise UserError(f"{b}: no input_dist on the critical path to measure an overlap on")
    input_dist = float(per_step.median()) / max(1.0, base.evidence.inflation or 1.0)
    exposed = exposed_input_dist(sd, cache)
    steady = window_inflation(ms, exposed["step_s"])
    exposed_s = statistics.median(exposed["input_dist_s"]) / max(1.0, steady[1] if steady else 1.0)
    verdict = spanning(
        [compare_profiles(x, sd, confidence=CONFIDENCE) for x in (b, *map(Path, models))]
    )
    step_b = verdict.baseline.median_s
    step_s = step_b / verdict.ratio  # the median step where unpaired
    low, high = step_b - step_b / verdict.low, step_b - step_b / verdict.high
    overlap, pays, share, share_low, hidden, overhead = overlap_of(
        input_dist, exposed_s, step_b, step_s, low
    )
    return PipelineOverlap(
        overlap=overlap,
        pays=pays,
        share=share,
        share_low=share_low,
        input_dist_s=input_dist,
        exposed_s=exposed_s,
        hidden_s=hidden,
        overhead_s=overhead,
        base_step_s=step_b,
        sparse_dist_step_s=step_s,
        saving_low_s=low,
        saving_high_s=high,
        base_profile=str(b),
        sparse_dist_profile=str(sd),
    )


def with_pipeline(cal: Calibration, fit: PipelineOverlap, level: float = 1.0) -> Calibration:
    """`cal` carrying the pipeline's measured overlap and overhead, whether it pays, and the two
    profiles they were measured on. `level`: the speed level of the two profiles' job
    (`job_levels`); the overhead, a duration, is divided by it to be at the speed `cal` was
    fitted at, the overlap is a share and stays."""
    return dataclasses.replace(
        cal,
        pipeline_overlap=fit.overlap,
        pipeline_pays=fit.pays,
        pipeline_overhead_s=fit.overhead_s / level,
        pipeline_profiles=fit.profiles,
    )
