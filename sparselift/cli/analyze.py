"""`sparselift analyze DIR [DIR ...] [--out OUT] [--html REPORT]`: the analysis stage on the command
line. Several profiles of one job are calibrated together (`analysis.joint`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sparselift.analysis.findings import key_findings
from sparselift.analysis.joint import JointFit, check_one_job, fit_jointly, held_out_lines
from sparselift.analysis.pipeline import OUTPUTS, Analysis, analyze, check_output_dir, write_outputs
from sparselift.analysis.pipeline_overlap import (
    PipelineOverlap,
    fit_pipeline_overlap,
    with_pipeline,
)
from sparselift.analysis.summary import format_summary
from sparselift.atomic import check_writable
from sparselift.calibration import Calibration
from sparselift.errors import UserError
from sparselift.profile_manifest import shared_cores


def register(sub: argparse._SubParsersAction) -> None:
    """Add `analyze` to the `sparselift` sub-commands."""
    p = sub.add_parser(
        "analyze", help="rebuild the sparse path of a profile, summarize it and calibrate costs"
    )
    p.add_argument("dir", metavar="DIR", help="profile directory (from `sparselift profile`)")
    p.add_argument(
        "more",
        nargs="*",
        metavar="DIR",
        help="more profiles of the same job (other plans, or DIR's plan under the sparse-dist "
        "pipeline): calibrate on all of them together and print each one's leave-one-out error",
    )
    p.add_argument("--out", default=None, metavar="OUT", help="output directory (default: DIR)")
    p.add_argument(
        "--no-cache", action="store_true", help="do not read or write the parsed-trace cache"
    )
    p.add_argument(
        "--html", default=None, metavar="REPORT", help="also write a self-contained HTML report"
    )
    p.add_argument(
        "--pipeline-profile",
        default=None,
        metavar="DIR2",
        help="a profile of the same plan under the sparse-dist pipeline (DIR under the base one): "
        "calibrate the share of input_dist that pipeline hides and its overhead per step",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="processes parsing the ranks' traces (default: one per core, at most one per rank)",
    )
    p.add_argument(
        "--allow-missing-ranks",
        action="store_true",
        help="analyze the ranks whose traces arrived, leaving out those the manifest names missing",
    )
    p.set_defaults(run=run_analyze)


MAX_WORKERS = 1024


def calibration_line(cal: Calibration) -> str:
    """One line: each op kind's fit (ms per call, per-unit cost, r², samples), dense step (and
    what each sharding type adds to it, where measured)."""
    fits = ", ".join(
        f"{kind} a={fit.a_s * 1e3:.3f}ms"
        + (f" sync={fit.sync_s * 1e3:.3f}ms" if fit.sync_s else "")
        + f" b={fit.b_s:.3g}/{fit.x} r2={fit.r2:.2f} n={fit.n}"
        for kind, fit in cal.ops.items()
    )
    dense = f"{cal.dense_step_s * 1e3:.2f} ms" if cal.dense_step_s is not None else "not measured"
    per_type = (
        f", plus {cal.type_overhead_s * 1e3:.2f} ms per model-parallel sharding type"
        if cal.type_overhead_s is not None
        else ""
    )
    return f"calibration: {fits}; dense_step {dense}{per_type}"


def pipeline_line(fit: PipelineOverlap) -> str:
    """What the pipeline's fit measured, in one line (milliseconds)."""
    saving = fit.base_step_s - fit.sparse_dist_step_s
    return (
        f"pipeline: sparse-dist hides {fit.hidden_s * 1e3:.2f} ms of input_dist's "
        f"{fit.input_dist_s * 1e3:.2f} ms ({fit.exposed_s * 1e3:.2f} ms left on its main "
        f"thread) at an overhead of {fit.overhead_s * 1e3:.2f} ms per step (both measured); step "
        f"{fit.base_step_s * 1e3:.2f} ms base, {fit.sparse_dist_step_s * 1e3:.2f} ms sparse-dist "
        f"in {fit.sparse_dist_profile}, saving {saving * 1e3:.2f} ms "
        f"({fit.saving_low_s * 1e3:.2f} to {fit.saving_high_s * 1e3:.2f} ms); overlap "
        f"{fit.overlap:.0%}; "
        + ("measured faster" if fit.pays else "not measured faster: not chosen")
    )


def _pipeline_fit(a: Analysis, args: argparse.Namespace) -> PipelineOverlap:
    """The pipeline's overlap and overhead measured against `--pipeline-profile`."""
    return fit_pipeline_overlap(a, args.pipeline_profile, cache=not args.no_cache)


def _analyze(d: str, args: argparse.Namespace) -> Analysis:
    """`pipeline.analyze` of profile `d` with the flags' cache and workers, progress printed."""
    return analyze(
        d,
        cache=not args.no_cache,
        progress=lambda line: print(line, flush=True),
        workers=args.workers,
        allow_missing_ranks=args.allow_missing_ranks,
    )


def _joint(a: Analysis, args: argparse.Namespace) -> JointFit:
    """The calibration fitted on DIR and every further profile together."""
    others = [_analyze(d, args) for d in args.more]
    return fit_jointly([a, *others], cache=not args.no_cache)


def run_analyze(args: argparse.Namespace) -> int:
    """Analyze args.dir, write its outputs, print the findings and the summary; 0 on success.

    Raises:
        UserError: bad profile directory or unwritable output (exit 2, nothing written).
    """
    out = Path(args.out or args.dir)
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise UserError(f"--workers must be between 1 and {MAX_WORKERS}, got {args.workers}")
    check_output_dir(out)
    if args.html:
        check_writable(args.html)
    if args.more:
        check_one_job([args.dir, *args.more])
    a = _analyze(args.dir, args)
    joint = _joint(a, args) if args.more else None
    if joint is not None:
        a.calibration = joint.calibration
    fit = _pipeline_fit(a, args) if args.pipeline_profile else None
    if fit is None and joint is not None:
        fit = joint.pipeline
    if fit is not None:
        a.calibration = with_pipeline(a.calibration, fit)
    write_outputs(a, out)
    print(key_findings(a.summary, a.critical_path, a.nodes))
    print(format_summary(a.summary, a.critical_path))
    if a.unplaced:
        print(f"could not place ({len(a.unplaced)}):")
        for line in a.unplaced:
            print(f"  {line}")
    print(calibration_line(a.calibration))
    crowded = shared_cores([args.dir, *args.more])
    if crowded:
        print(crowded)
    if joint is not None:
        print("\n".join(held_out_lines(joint)))
    if fit is not None:
        print(pipeline_line(fit))
    print(f"wrote {', '.join(OUTPUTS)} to {out}")
    if args.html:
        # deferred: HoloViews and Bokeh take seconds to import, and only the report needs them
        from sparselift.analysis.report import write_report
        from sparselift.analysis.views import open_profile, profile_sections

        write_report(
            args.html,
            f"SparseLift profile: {args.dir}",
            profile_sections(open_profile(args.dir, a)),
        )
        print(f"wrote {args.html}")
    return 0
