"""`sparselift plan show|validate|diff|check|from-torchrec|round-robin`.

CLI code: unlike the loader it may import the rest of SparseLift (workload specs, model builders,
reports). Bad input raises PlanError / UserError, which the CLI prints as one line with exit code 2;
output paths are checked before any work, so a refusal leaves no file.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from sparselift.plans.baselines import DEVICE_PRESETS
from sparselift.plans.types import MAX_WORLD_SIZE

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

    q = psub.add_parser(
        "from-torchrec", help="export the plan TorchRec's EmbeddingShardingPlanner makes"
    )
    _add_topology_args(q)
    q.add_argument(
        "--batch-size", type=int, default=None, help="per rank (default: the workload's)"
    )
    q.set_defaults(run=run_from_torchrec, command="plan from-torchrec")

    q = psub.add_parser(
        "round-robin", help="write the DLRM reference plan: table i whole on rank i mod N"
    )
    _add_topology_args(q)
    q.set_defaults(run=run_round_robin, command="plan round-robin")


def _add_topology_args(q: argparse.ArgumentParser) -> None:
    q.add_argument("--workload", required=True)
    q.add_argument("--world-size", type=int, required=True)
    q.add_argument(
        "--local-world-size", type=int, default=None, help="ranks per host (default: world size)"
    )
    q.add_argument(
        "--device", default="cpu", help=f"device preset: {', '.join(DEVICE_PRESETS)} (default cpu)"
    )
    q.add_argument(
        "--max-rows", type=int, default=None, help="hash ids into at most this many rows per table"
    )
    q.add_argument("--out", required=True, help="plan file to write")


def _check_world_size(flag: str, n: int) -> None:
    from sparselift.errors import UserError

    if not 1 <= n <= MAX_WORLD_SIZE:
        raise UserError(f"{flag} must be in 1..{MAX_WORLD_SIZE:,}, got {n:,}")


def _topology(args: argparse.Namespace) -> Any:
    """The PlanTopology of --world-size, --local-world-size and --device (UserError if bad)."""
    from sparselift.errors import UserError
    from sparselift.plans.types import PlanTopology

    if args.device not in DEVICE_PRESETS:
        raise UserError(
            f"unknown --device preset {args.device!r} (known: {', '.join(DEVICE_PRESETS)})"
        )
    _check_world_size("--world-size", args.world_size)
    local = args.world_size if args.local_world_size is None else args.local_world_size
    if local < 1 or args.world_size % local:
        raise UserError(
            f"--world-size {args.world_size} must be a positive multiple of "
            f"--local-world-size {local}"
        )
    return PlanTopology(
        world_size=args.world_size,
        local_world_size=local,
        device=DEVICE_PRESETS[args.device]["device"],
        preset=None if args.device == DEVICE_PRESETS[args.device]["device"] else args.device,
    )


def _provenance(args: argparse.Namespace, how: str) -> dict[str, Any]:
    """What a written plan was made by and from: command, workload, row cap, versions."""
    import torch
    import torchrec

    import sparselift

    return {
        "made_by": how,
        "workload": args.workload,
        "max_rows": args.max_rows,
        "versions": {
            "sparselift": getattr(sparselift, "__version__", None),
            "torch": torch.__version__,
            "torchrec": getattr(torchrec, "__version__", None),
        },
    }


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
        _check_world_size("--world-size", args.world_size)
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
    manifest, the plan's digest, the profile's statistics and that they are of the plan's tables.
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


def run_from_torchrec(args: argparse.Namespace) -> int:
    """Write the plan TorchRec's planner makes for --workload on the topology; 0.

    Raises:
        UserError: bad input (refused before the planner runs), or PlanError: the planner
            found no plan.
    """
    import torch

    from sparselift.atomic import check_writable
    from sparselift.errors import UserError
    from sparselift.plans import from_torchrec, save, torchrec_plan
    from sparselift.workloads.models import build_model
    from sparselift.workloads.spec import MAX_BATCH_SIZE, load_workload

    topology = _topology(args)
    if args.batch_size is not None and not 1 <= args.batch_size <= MAX_BATCH_SIZE:
        raise UserError(f"--batch-size must be in 1..{MAX_BATCH_SIZE:,}, got {args.batch_size:,}")
    spec = load_workload(args.workload).capped(args.max_rows)
    check_writable(args.out)
    model = build_model(spec, dense_device=torch.device("cpu"))
    batch = args.batch_size or spec.batch_size
    plan = from_torchrec(
        torchrec_plan(model, topology, batch),
        spec.fingerprints(),
        topology,
        provenance={**_provenance(args, "sparselift plan from-torchrec"), "batch_size": batch},
    )
    save(plan, args.out)
    print(
        f"wrote {args.out}: TorchRec's plan for {spec.name} on {topology.world_size} "
        f"{topology.device} ranks"
    )
    return 0


def run_round_robin(args: argparse.Namespace) -> int:
    """Write the round-robin table-wise reference plan for --workload; 0.

    Raises:
        UserError: bad input, refused before anything is written.
    """
    import torch

    from sparselift.atomic import check_writable
    from sparselift.plans import round_robin_table_wise, save
    from sparselift.plans.to_torchrec import model_tables
    from sparselift.workloads.models import build_model
    from sparselift.workloads.spec import load_workload

    topology = _topology(args)
    spec = load_workload(args.workload).capped(args.max_rows)
    check_writable(args.out)
    model = build_model(spec, dense_device=torch.device("cpu"))
    paths = {found.path for found in model_tables(model)}
    plan = round_robin_table_wise(
        spec.fingerprints(),
        topology,
        module=paths.pop() if len(paths) == 1 else None,
        provenance=_provenance(args, "sparselift plan round-robin"),
    )
    save(plan, args.out)
    print(
        f"wrote {args.out}: round-robin table-wise plan for {spec.name} on "
        f"{topology.world_size} ranks"
    )
    return 0
