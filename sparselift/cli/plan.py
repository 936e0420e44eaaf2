"""`sparselift plan show|validate|diff|check` (and `from-torchrec|round-robin`: `plan_export`).

CLI code: unlike the loader it may import the rest of SparseLift (workload specs, model builders,
reports). Bad input raises PlanError / UserError, which the CLI prints as one line with exit code 2;
output paths are checked before any work, so a refusal leaves no file.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from sparselift.cli import plan_export

if TYPE_CHECKING:
    from sparselift.optimizer.recheck import Recheck


def register(sub: argparse._SubParsersAction) -> None:
    """Add `plan` and its actions to the `sparselift` sub-commands."""
    p = sub.add_parser("plan", help="inspect, check, compare and export sharding plans")
    psub = p.add_subparsers(dest="plan_command", required=True, metavar="ACTION")

    q = psub.add_parser("show", help="per-table and per-rank view of a plan")
    q.add_argument("plan")
    q.add_argument(
        "--html",
        default=None,
        metavar="OUT",
        help="also write a self-contained HTML report of the plan (placement, splits, collectives)",
    )
    q.set_defaults(run=run_show, command="plan show")

    q = psub.add_parser(
        "validate", help="check a plan file, and optionally that it fits a workload"
    )
    q.add_argument("plan")
    q.add_argument(
        "--workload", default=None, help="also check the plan against this workload's tables"
    )
    q.add_argument(
        "--max-rows", type=int, default=None, help="the workload's row cap the plan was made for"
    )
    q.add_argument(
        "--world-size", type=int, default=None, help="ranks it will run on (default: the plan's)"
    )
    q.set_defaults(run=run_validate, command="plan validate")

    q = psub.add_parser("diff", help="what differs between plan A and plan B")
    q.add_argument("a")
    q.add_argument("b")
    q.add_argument(
        "--bench",
        default=None,
        metavar="JSON",
        help="a `sparselift bench --json` result to show too",
    )
    q.add_argument(
        "--html", default=None, metavar="OUT", help="also write a self-contained HTML report"
    )
    q.set_defaults(run=run_diff, command="plan diff")

    q = psub.add_parser(
        "check",
        help="is this plan still right? its statistics against a new profile, and what "
        "re-planning would gain (exit 1 if more than --threshold)",
    )
    q.add_argument("plan")
    q.add_argument("--profile", required=True, metavar="DIR", help="a profile directory")
    q.add_argument(
        "--threshold",
        type=float,
        default=0.05,
        help="predicted gain of re-planning above which the plan is stale (default 0.05: 5%%)",
    )
    q.add_argument(
        "--time-limit",
        type=float,
        default=30.0,
        help="seconds of the re-planning solve (default 30)",
    )
    q.set_defaults(run=run_check, command="plan check")

    plan_export.register(psub)


def run_show(args: argparse.Namespace) -> int:
    """Print the per-table and per-rank view of a plan (and write --html: that view, then the
    sections `plan diff --html` shows, of this one plan); 0.

    Raises:
        PlanError: the plan is bad.
        UserError: an unwritable --html, refused before the plan is read.
    """
    from sparselift.atomic import check_writable
    from sparselift.plans import load
    from sparselift.plans.render import show

    if args.html:
        check_writable(args.html)
    plan = load(args.plan)
    text = show(plan)
    print(text)
    if args.html:
        from sparselift.analysis.report import write_report
        from sparselift.analysis.views import plan_label, plan_sections

        write_report(
            args.html,
            f"Plan: {args.plan}",
            [("Plan", text)] + plan_sections({plan_label(args.plan): plan}),
        )
        print(f"wrote {args.html}")
    return 0


def run_validate(args: argparse.Namespace) -> int:
    """Check a plan (and that it fits --workload on --world-size); 0 and one line if it does.

    Raises:
        PlanError: the plan is bad or does not fit (every problem listed).
        UserError: a bad workload or number.
    """
    from sparselift.errors import UserError
    from sparselift.plans import load
    from sparselift.workloads.spec import load_workload

    if args.world_size is not None:
        plan_export.check_world_size("--world-size", args.world_size)
    plan = load(args.plan)
    spec = load_workload(args.workload).capped(args.max_rows) if args.workload else None
    world = args.world_size or plan.topology.world_size
    what = ""
    if spec is not None:
        plan.check_spec(spec.fingerprints(), world)
        what = f", fits {args.workload}" + (f" --max-rows {args.max_rows}" if args.max_rows else "")
    elif world != plan.topology.world_size:  # check_spec says so too, with the model's tables
        raise UserError(
            f"{args.plan}: plan is for world_size {plan.topology.world_size}, not --world-size "
            f"{world}"
        )
    print(f"{args.plan}: valid plan, {len(plan.tables)} tables on {world} ranks{what}")
    return 0


def run_diff(args: argparse.Namespace) -> int:
    """Print what differs between plans A and B (and write --html with --bench); 0.

    Raises:
        PlanError: a plan is bad.
        UserError: a bad --bench file or an unwritable --html, refused before anything is written.
    """
    from sparselift.atomic import check_writable
    from sparselift.bench import read_bench_result
    from sparselift.plans import load
    from sparselift.plans.render import diff

    if args.html:
        check_writable(args.html)
    a, b = load(args.a), load(args.b)
    bench = read_bench_result(args.bench) if args.bench else None
    lines = diff(a, b)
    text = "\n".join(lines) if lines else "the plans shard identically"
    print(text)
    if args.html:
        from sparselift.analysis.report import write_report
        from sparselift.analysis.views import load_plans, plan_sections

        write_report(
            args.html,
            f"Plans: {args.a} vs {args.b}",
            [("Differences", text)] + plan_sections(load_plans([args.a, args.b]), bench),
        )
        print(f"wrote {args.html}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    """Compare a plan's statistics digest with a profile, price it and re-plan; print a verdict.

    Checked in this order, each refusal one line: the flags, the plan file, the profile's
    manifest, the profile's statistics and that they are of the plan's tables. A plan without a
    statistics digest (TorchRec's, round-robin) is priced and re-planned, its drift not checked.
    Nothing is written.

    Returns:
        1 if re-planning is predicted to gain more than --threshold, else 0.
    Raises:
        UserError / PlanError: bad input (exit 2).
    """
    from pathlib import Path

    from sparselift.analysis.profile import read_manifest
    from sparselift.errors import UserError
    from sparselift.optimizer.recheck import recheck
    from sparselift.plans import load

    for flag, value in (("--threshold", args.threshold), ("--time-limit", args.time_limit)):
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"{flag} must be a finite number > 0, got {value}")
    plan = load(args.plan)
    read_manifest(Path(args.profile))
    res = recheck(plan, args.profile, threshold=args.threshold, time_limit_s=args.time_limit)
    print(
        f"plan {args.plan} against profile {args.profile}: {len(plan.tables)} tables, "
        f"batch {res.batch_size}/rank, {res.topology.world_size} ranks "
        f"({res.topology.preset or 'topology file'}), coefficients: {res.coefficients}"
        + ("" if res.calibrated else f" (no calibration.json: `sparselift analyze {args.profile}`)")
    )
    print(_drift_table(res))
    recorded = (plan.predicted or {}).get("step_time_s")
    ms = 1e3
    print(
        f"predicted step: {res.predicted.step_time_s * ms:.3f} ms under the profile's statistics"
        + (f" (the plan recorded {recorded * ms:.3f} ms)" if recorded is not None else "")
    )
    print(
        f"re-planned step: {res.replanned.cost.step_time_s * ms:.3f} ms "
        f"({res.gain:.1%} faster; solver {res.replanned.solution.status}"
        + ("; no plan found beats this one)" if res.replanned.kept_baseline else ")")
    )
    if res.stale:
        print(
            f"verdict: stale: re-planning is predicted {res.gain:.1%} faster, more than "
            f"--threshold {args.threshold:.1%}; re-plan: "
            f"`sparselift optimize --profile {args.profile}`"
        )
        return 1
    print(
        f"verdict: still right: re-planning is predicted {res.gain:.1%} faster, not more than "
        f"--threshold {args.threshold:.1%}"
    )
    return 0


def _drift_table(res: Recheck) -> str:
    """The drifted fields as a table (table, field, plan, profile, change), or one line."""
    head = f"statistics drift over {res.tolerance:.0%} (relative change of a digest field)"
    if res.drifts is None:
        return (
            "statistics drift: not checked: the plan records no statistics digest (not made by "
            "`sparselift optimize`, or before plans recorded one)"
        )
    if not res.drifts:
        return f"{head}: none"
    width = max(5, *(len(d.table) for d in res.drifts))
    tables = len({d.table for d in res.drifts})
    lines = [
        f"{head}: {tables} table(s)",
        f"  {'table':{width}s} {'field':12s} {'plan':>12s} {'profile':>12s} {'change':>8s}",
    ]
    for d in res.drifts:
        change = "new" if math.isinf(d.change) else f"{d.change:+.0%}"
        lines.append(
            f"  {d.table:{width}s} {d.field:12s} {d.plan_value:12.6g} {d.profile_value:12.6g} "
            f"{change:>8s}"
        )
    return "\n".join(lines)
