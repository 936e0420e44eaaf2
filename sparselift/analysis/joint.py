"""Fit one calibration on several profiles of the same job, and check it profile by profile.

Profiles of different plans (and, for the pipeline, of the same plan under each pipeline) measure
what one profile cannot tell apart: a call's fixed cost from its size, the lookup unit's weights,
the share of input_dist the sparse-dist pipeline hides, what 16-bit collectives cost. The op
kinds are fitted on every base-pipeline profile together (`fit.fit_evidence`), their output
distributions at 16 bits apart (`precision_fit`); a sparse-dist profile is paired with the base
profile of the same plan for the pipeline's overlap and overhead (`pipeline_overlap`). Each base
profile is then predicted by the fit on the others (leave-one-out): how far the calibration
carries to a plan it did not see. The batch transform and the recombination do not depend on the
pipeline: each is fitted on every profile's timings, sparse-dist ones included. Profiles of
separate jobs are first levelled to one job's speed (`job_levels`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sparselift.analysis.compare import check_same_job, job_models
from sparselift.analysis.evidence import ProfileEvidence
from sparselift.analysis.fit import fit_evidence, recombine_fit_of, transform_fit_of
from sparselift.analysis.job_levels import JobLevel, job_levels, level_of, levelled
from sparselift.analysis.pipeline import Analysis
from sparselift.analysis.pipeline_overlap import (
    SPARSE_DIST,
    PipelineOverlap,
    fit_pipeline_overlap,
    with_pipeline,
)
from sparselift.analysis.precision_fit import (
    QCOMM,
    at_precision,
    fit_qcomm,
    measured_faster,
    precision_of,
    split_by_precision,
    steps_net,
)
from sparselift.analysis.recombine_fit import RECOMBINE
from sparselift.analysis.step_model import dense_fit, fit_of, sparse_at_target, with_rs_kinds
from sparselift.analysis.transform_fit import TRANSFORM
from sparselift.analysis.type_overhead import (
    DenseFit,
    model_parallel_types,
    profiled_sharding_types,
)
from sparselift.calibration import (
    A2A_KIND,
    UNITS,
    Calibration,
    HeldOut,
    OpFit,
)
from sparselift.calibration_parts import unmeasured_note
from sparselift.errors import UserError
from sparselift.kernels import CPU_CALL_S, CPU_DIST_B_S, CPU_WORK_B_S


@dataclasses.dataclass(frozen=True)
class JointFit:
    """A calibration fitted on several profiles, and what it was fitted from.

    Attributes:
        calibration: the joint fit (its `held_out` filled in when there are ≥ 2 base profiles,
            its pipeline overlap and overhead when a sparse-dist profile has a base twin).
        base: the profiles the op kinds were fitted on.
        pipeline: the pipeline's fit, or None.
        levels: each base profile's job level (`job_levels`), in `base`'s order.
    """

    calibration: Calibration
    base: tuple[str, ...]
    pipeline: PipelineOverlap | None
    levels: tuple[JobLevel, ...] = ()


def check_one_job(profiles: Sequence[str]) -> None:
    """Refuse profiles of different jobs given together.

    Raises:
        UserError: one line naming the first profile, the first that differs from it and how
            (`compare.check_same_job`).
    """
    for other in profiles[1:]:
        check_same_job(profiles[0], other)


def prior_fit(kind: str, device: str) -> OpFit | None:
    """What an op kind costs before any profile measured it (CPU: the kernel benchmarks'), for
    a held-out profile whose op kinds the other profiles lack (a reduce-scatter output kind: its
    all-to-all's); None off CPU."""
    measured_as = A2A_KIND.get(kind, kind)  # a reduce-scatter: the all-to-all's, by analogy
    if device != "cpu" or measured_as not in CPU_CALL_S:
        return None
    b = CPU_WORK_B_S.get(measured_as, CPU_DIST_B_S)
    return OpFit(x=UNITS[kind], a_s=CPU_CALL_S[measured_as], b_s=b, r2=0.0, n=0)


def fit_profiles(evidence: list[ProfileEvidence]) -> Calibration:
    """`fit.fit_evidence` with 16-bit output distributions fitted apart (`precision_fit`): the
    op kinds on the fp32 calls, their net 16-bit cost as `qcomm_quantize` (as paired steady
    steps paid it where there are such, `precision_fit.steps_net`; a saving only where the steps
    measured it, `precision_fit.measured_faster`), and the dense step (and per-type
    overhead) from every profile priced at its own precision."""
    kept, apart = split_by_precision(evidence)
    cal = fit_evidence(kept)
    q = fit_qcomm(apart, cal.ops)
    if q is not None:
        net = steps_net(evidence, apart)
        if net is not None:  # what the steps paid, not the window's calls
            q = dataclasses.replace(q, b_s=net)
        if q.b_s < 0.0 and not measured_faster(evidence):
            q = dataclasses.replace(q, b_s=0.0)  # a saving the steps did not show
        cal.ops[QCOMM] = q
        dense = dense_fit(
            evidence,
            [dict(at_precision(cal.ops, ev.manifest)) for ev in evidence],
            cal.lookup_rank_spread,
        )
        cal.dense_step_s, cal.type_overhead_s = dense.dense_step_s, dense.type_overhead_s
    return cal


def held_out(evidence: list[ProfileEvidence], i: int, level: float = 1.0) -> HeldOut:
    """Profile i's step (its `target_s`) predicted by the calibration fitted on the others;
    `level`: its job's (`evidence` is levelled already), recorded with it.

    Op kinds the others do not have are priced by `prior_fit` (or not at all off CPU); a
    reduce-scatter output kind by the others' all-to-all fit where they have one
    (`step_model.fit_of`), as the optimizer prices it.
    """
    ev = evidence[i]
    cal = fit_profiles(evidence[:i] + evidence[i + 1 :])
    ops = dict(at_precision(cal.ops, ev.manifest))
    for kind in with_rs_kinds(ev.calls)["kind"].unique():
        prior = prior_fit(kind, ev.device)
        if fit_of(ops, kind) is None and prior is not None:
            ops[kind] = prior
    dense = DenseFit(cal.dense_step_s or 0.0, cal.type_overhead_s)
    predicted = dense.residual_at(model_parallel_types(ev.manifest)) + sparse_at_target(
        ev, ops, cal.lookup_rank_spread
    )
    seen = set().union(*(plan_options(o.manifest) for j, o in enumerate(evidence) if j != i))
    unmeasured = sorted(plan_options(ev.manifest) - seen)
    return HeldOut(ev.profile, ev.target_s, predicted, level, unmeasured)


def plan_options(manifest: Mapping[str, Any]) -> set[str]:
    """The options a profile's plan ran that a calibration prices from measurements of them:
    its sharding types (as "<type> tables"), 16-bit comm and split tables."""
    out = {f"{t} tables" for t in profiled_sharding_types([manifest])}
    if any(p != "fp32" for p in precision_of(dict(manifest)).values()):
        out.add("16-bit comm")
    if manifest.get("splits"):
        out.add("split tables")
    return out


def fit_jointly(analyses: Sequence[Analysis], cache: bool = True) -> JointFit:
    """One calibration from several analyzed profiles of the same job.

    Args:
        analyses: `pipeline.analyze` of each profile (at least one under the base pipeline);
            the first base profile names the calibration.
        cache: read and write the parsed-trace cache where a sparse-dist profile's traces are
            read again (`pipeline_overlap.exposed_input_dist`).
    Returns:
        The JointFit.
    Raises:
        UserError: the profiles are of different jobs; none is under the base pipeline; a
            sparse-dist profile has no base profile of the same plan, or is not one TorchRec's
            way (`pipeline_overlap.fit_pipeline_overlap`); a profile is given twice.
    """
    paths = [a.calibration.provenance.profile or "" for a in analyses]
    if len(set(paths)) < len(paths):
        raise UserError(f"a profile is given twice: {next(p for p in paths if paths.count(p) > 1)}")
    check_one_job(paths)
    sd = [a for a in analyses if a.manifest.get("pipeline") == SPARSE_DIST]
    base = [a for a in analyses if a.manifest.get("pipeline") != SPARSE_DIST]
    if not base:
        raise UserError(f"{paths[0]}: no profile under the base pipeline to fit the op costs on")
    levels = job_levels([a.evidence for a in base])
    evidence = levelled([a.evidence for a in base], levels)
    cal = fit_profiles(evidence)
    timed = evidence + levelled([a.evidence for a in sd], levels)
    tx = transform_fit_of(timed)
    if tx is not None:
        cal.ops[TRANSFORM] = tx
    rc = recombine_fit_of(timed)
    if rc is not None:
        cal.ops[RECOMBINE] = rc
    if len(evidence) > 1:
        cal.held_out = [held_out(evidence, i, levels[i].level) for i in range(len(evidence))]
    overlap = _pipeline(base, sd, cache) if sd else None
    if overlap is not None:
        cal = with_pipeline(cal, overlap, level_of(levels, sd[0].evidence))
    cal.provenance.profiles = paths if len(paths) > 1 else []
    return JointFit(cal, tuple(ev.profile for ev in evidence), overlap, tuple(levels))


def _pipeline(base: list[Analysis], sd: list[Analysis], cache: bool) -> PipelineOverlap:
    """The pipeline's fit of the first sparse-dist profile against the first base profile of
    its plan, its verdict against every model of that plan in its job (`compare.job_models`)."""
    target = sd[0]
    twins = [a for a in base if a.manifest.get("sharding") == target.manifest.get("sharding")]
    where = target.calibration.provenance.profile or ""
    if not twins:
        raise UserError(
            f"{where}: a {SPARSE_DIST} profile needs a base-pipeline profile of the same plan "
            "among the profiles given"
        )
    paths = [a.calibration.provenance.profile or "" for a in twins]
    others = [m for m in job_models(where, paths) if m != paths[0]]
    return fit_pipeline_overlap(twins[0], where, cache, others)


def held_out_lines(joint: JointFit) -> list[str]:
    """What the joint fit was made of, each job's level, and each profile predicted by the fit
    on the others (`check_lines`)."""
    lines = [f"calibrated on {len(joint.base)} profiles together: {', '.join(joint.base)}"]
    first = joint.levels[0].job if joint.levels else None
    others = [lv for lv in joint.levels if lv.job != first]
    for job in dict.fromkeys(lv.job for lv in others if lv.linked):  # a line a job
        of = [lv for lv in others if lv.job == job]
        lines.append(
            f"  the job of {', '.join(lv.profile for lv in of)} ran at {of[0].level:.3f}× the "
            f"steps of {joint.base[0]}'s (measured on {', '.join(of[0].via)}): its steps are "
            f"fitted ÷ {of[0].level:.3f}"
        )
    alone = [lv.profile for lv in others if not lv.linked]
    if alone:
        lines.append(
            f"  not levelled (their jobs share no plan with {joint.base[0]}'s, fitted as "
            f"measured): {', '.join(alone)}"
        )
    return lines + check_lines(joint.calibration)


def check_lines(cal: Calibration) -> list[str]:
    """Each profile of a joint calibration predicted by the fit on the others, and the lookup
    unit's refitted weights."""
    lines = []
    for h in cal.held_out:
        in_job = (
            f" ({h.measured_step_s * h.level * 1e3:.2f} ms in its job)" if h.level != 1.0 else ""
        )
        lines.append(
            f"  left out {h.profile}: predicted {h.predicted_step_s * 1e3:.2f} ms, measured "
            f"{h.measured_step_s * 1e3:.2f} ms{in_job} ({h.error:+.1%})"
            + (f"; {unmeasured_note(h.unmeasured)}" if h.unmeasured else "")
        )
    if cal.lookup_rank_spread is not None:
        lines.append(
            f"  a rank's own lookups stray {cal.lookup_rank_spread:.1%} from the fitted lines "
            "(the cost model prices how much later the slowest rank ends)"
        )
    for kind in ("lookup_fwd", "lookup_bwd"):
        fit = cal.ops.get(kind)
        weights = (fit.unique_weight, fit.bag_weight, fit.footprint_weight) if fit else (None,)
        if any(w is not None for w in weights):
            kappa, mu, phi = (
                default if w is None else f"{w:.3g}"
                for w, default in zip(weights, ("kernel's", "kernel's", "none"), strict=True)
            )
            lines.append(f"  {kind} unit refitted: κ {kappa}, μ {mu}, φ {phi}")
    return lines
