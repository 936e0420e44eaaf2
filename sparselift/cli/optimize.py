"""`sparselift optimize`: plan the sparse path for a profile or a workload on a target topology."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparselift.cli.optimize_report import report
from sparselift.errors import UserError
from sparselift.profile_manifest import read_manifest, shared_cores

if TYPE_CHECKING:
    from sparselift import plans
    from sparselift.calibration import Calibration
    from sparselift.optimizer.optimize import Inputs

# What keeps `optimize` under about a minute at 1,000 tables × 128 ranks: TorchRec's planner does
# not finish there, and the solve waits for it before it starts (see benchmarks/README.md).
DEFAULT_BASELINE_TIMEOUT_S = 20.0
# Bounds of the number flags: past them the solver's integer model overflows or is refused.
MAX_WORLD_SIZE = 2**16
MAX_SEED = 2**31 - 1
MAX_BATCH_SIZE = 2**24
MAX_WORKERS = 1024


def register(sub: Any) -> None:
    """Add `optimize` to the CLI's sub-commands (`sub`: argparse's subparsers)."""
    p = sub.add_parser("optimize", help="choose a sharding/kernel/qcomm/pipeline plan with CP-SAT")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--profile",
        metavar="DIR",
        action="append",
        help="a profile directory analyzed by `sparselift analyze`; repeat it for several "
        "profiles of the same job (other plans, pipelines), calibrated together",
    )
    src.add_argument("--workload", help="built-in workload name or spec path (what-if planning)")
    p.add_argument(
        "--calibration", metavar="FILE", help="with --workload: a calibration.json to price with"
    )
    p.add_argument(
        "--topology", metavar="FILE", help="a topology file (format sparselift-topology)"
    )
    p.add_argument(
        "--world-size", type=int, default=None, help="ranks (default: the profile's, else 2)"
    )
    p.add_argument(
        "--local-world-size", type=int, default=None, help="ranks per host (default: the profile's)"
    )
    p.add_argument(
        "--device",
        default=None,
        help="preset: cpu-gloo, h100x8, h200x8 (default: the hardware "
        "the profile or calibration ran on, else cpu-gloo)",
    )
    p.add_argument(
        "--max-rows", type=int, default=None, help="with --workload: cap every table's rows"
    )
    p.add_argument(
        "--batch-size", type=int, default=None, help="samples per rank (default: workload/profile)"
    )
    p.add_argument("--time-limit", type=float, default=30.0, help="solver seconds (default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--workers", type=int, default=1, help="CP-SAT workers (1: deterministic, default)"
    )
    p.add_argument("--mode", choices=("auto", "exact", "decomposed"), default="auto")
    p.add_argument(
        "--baseline-timeout",
        type=float,
        default=DEFAULT_BASELINE_TIMEOUT_S,
        help=f"seconds TorchRec's planner may take (default {DEFAULT_BASELINE_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--no-baseline", action="store_true", help="skip TorchRec's planner (no warm start)"
    )
    p.add_argument(
        "--min-gain",
        type=float,
        default=0.10,
        help="keep TorchRec's plan unless ours is predicted this much faster (default 0.10: "
        "held-out predictions measured within about 10-15%%)",
    )
    p.add_argument(
        "--baseline-out",
        default=None,
        metavar="FILE",
        help="also write TorchRec's plan for the same inputs (pooling factors, topology)",
    )
    p.add_argument(
        "--splits",
        choices=("auto", "off"),
        default="auto",
        help="auto (default): the plan may split tables into virtual tables: hot/cold splits "
        "from the profile's hot ids, row ranges and column slices; off: TorchRec's options only",
    )
    p.add_argument(
        "--split-margin",
        type=float,
        default=None,
        help="take a plan with splits only if predicted this much faster than the best plan "
        "without (default: the calibration's largest leave-one-out error, else --min-gain; "
        "`tune` sets it, since it measures a plan before shipping it)",
    )
    p.add_argument("--out", required=True, help="plan file to write")
    p.set_defaults(run=run_optimize)


def _inputs(args: argparse.Namespace) -> tuple[Inputs, plans.Plan | None]:
    """Statistics, topology, batch size and coefficients from the flags (a profile or a
    workload spec), and the plan the (first) profile trained with, if it describes one."""
    from sparselift.calibration import read_checked
    from sparselift.optimizer.coefficients import coefficients
    from sparselift.optimizer.crowding import crowded_coefficients
    from sparselift.optimizer.optimize import Inputs
    from sparselift.optimizer.profile_input import plan_in_force, read_profile
    from sparselift.optimizer.split_options import split_options
    from sparselift.optimizer.table_stats import stats_from_spec
    from sparselift.optimizer.topology import dense_step_estimate, load_topology, profiled_topology

    calibration, spec, in_force, hot = None, None, None, None
    profile = statistics_profile(args.profile) if args.profile else None
    if profile is not None:
        prof = read_profile(profile, need_calibration=len(args.profile) == 1)
        calibration, stats, batch = prof.calibration, prof.stats, prof.batch_size
        in_force, hot = prof.plan_in_force, prof.hot_ids
        if profile != args.profile[0]:  # the plan to beat is the one the first profile ran
            in_force = plan_in_force(read_manifest(args.profile[0]))
        if len(args.profile) > 1:
            calibration = _joint_calibration(args.profile)
        crowded = shared_cores(args.profile)
        if crowded:
            print(crowded)
        provenance: dict[str, Any] = {"profile": str(profile)}
        if len(args.profile) > 1:
            provenance["profiles"] = [str(p) for p in args.profile]
    else:
        from sparselift.workloads.spec import load_workload

        spec = load_workload(args.workload).capped(args.max_rows)
        stats, batch = stats_from_spec(spec), spec.batch_size
        if args.calibration:
            calibration = read_checked(args.calibration)
        provenance = {"workload": spec.name, "max_rows": args.max_rows}
    batch = args.batch_size or batch
    if args.topology:
        if args.world_size or args.device:
            raise UserError(
                "--topology already says the world size and device; drop --world-size/--device"
            )
        topo = load_topology(args.topology)
    else:
        topo = profiled_topology(
            calibration,
            profile or args.calibration,
            args.world_size,
            args.local_world_size,
            args.device,
        )
    dense = dense_step_estimate(spec, topo, batch) if spec is not None else 0.0
    provenance["topology"] = topo.preset or args.topology
    offered = split_options(stats, topo.world_size, hot) if args.splits == "auto" else {}
    coeffs = coefficients(topo, calibration, dense)
    if args.profile:  # ranks that shared cores: priced from the plan the first profile ran
        coeffs = crowded_coefficients(coeffs, args.profile[0], in_force, stats, topo, batch, hot)
    return Inputs(stats, topo, batch, coeffs, provenance, offered, hot or {}), in_force


def statistics_profile(profiles: list[str]) -> str:
    """The profile planning reads the table statistics from: the first without splits (a split
    plan's profile counts lookups per virtual table), else the first (`read_profile` refuses
    it, in one line)."""
    if len(profiles) == 1:  # read_profile says what is wrong with it
        return profiles[0]
    return next((p for p in profiles if not read_manifest(p).get("model_tables")), profiles[0])


def _joint_calibration(profiles: list[str]) -> dict[str, Any]:
    """The calibration fitted on every profile together (`analysis.joint`), printing each one's
    leave-one-out error: the first profile's calibration.json where `sparselift analyze` fitted
    it on these profiles, in this order, after each was written (`_analyzed_together`), else
    fitted here.

    Raises:
        UserError: the profiles are of different jobs, or one is not a profile.
    """
    from sparselift.analysis.joint import check_lines, check_one_job, fit_jointly, held_out_lines
    from sparselift.analysis.pipeline import analyze

    check_one_job(profiles)
    saved = _analyzed_together(profiles)
    if saved is not None:
        print(
            f"calibration: {profiles[0]}/calibration.json, fitted on these {len(profiles)} "
            "profiles together by `sparselift analyze`"
        )
        print("\n".join(check_lines(saved)))
        return saved.to_dict()
    joint = fit_jointly([analyze(p) for p in profiles])
    print("\n".join(held_out_lines(joint)))
    return joint.calibration.to_dict()


def _analyzed_together(profiles: list[str]) -> Calibration | None:
    """The first profile's calibration.json if it was fitted on exactly `profiles` (its
    provenance lists them, in order) later than any of their manifests was written; else None.
    Why: `analyze A B …` already fitted it, and a refit takes as long again."""
    from sparselift.calibration import Calibration

    path = Path(profiles[0], "calibration.json")
    if not path.is_file():
        return None
    cal = Calibration.load(path)
    fitted_on = [Path(p).resolve() for p in cal.provenance.profiles]
    manifests = [Path(p, "manifest.json") for p in profiles]
    given = [Path(p).resolve() for p in profiles]
    if fitted_on != given or not all(m.is_file() for m in manifests):
        return None
    newest = max(m.stat().st_mtime for m in manifests)
    return cal if (cal.provenance.created_unix or 0.0) > newest else None


def run_optimize(args: argparse.Namespace) -> int:
    """Plan, write the plan (and TorchRec's with --baseline-out), print the comparison.

    TorchRec's planner runs twice (given the statistics; as a trainer calls it by default) in
    child processes beside the solve; the solver waits for them only once its first model is
    built. Returns 0; bad input raises UserError (one line, exit 2).
    """
    t_start = time.perf_counter()
    from sparselift import plans
    from sparselift.optimizer.optimize import optimize
    from sparselift.optimizer.torchrec_baseline import BaselineRun

    _check_flags(args)  # before TorchRec's planner runs and the solve
    inp, in_force = _inputs(args)
    if args.splits == "off" and in_force is not None and in_force.splits:
        print("the profiled plan has splits and --splits is off: it is not kept as it is")
        in_force = None
    topo = inp.topo
    if in_force is not None:
        was = in_force.topology
        if (was.world_size, was.local_world_size, was.device) != (
            topo.world_size,
            topo.local_world_size,
            topo.device,
        ):
            print(
                f"the profiled plan is for {was.world_size} {was.device} ranks, "
                f"{was.local_world_size} a host, not the {topo.world_size} {topo.device} ranks, "
                f"{topo.local_world_size} a host, planned for: it is not kept"
            )
            in_force = None
    print(
        f"planning {len(inp.stats)} tables for {topo.world_size} ranks ({topo.num_hosts} host(s), "
        f"{topo.preset or 'topology file'}, {topo.device}), batch {inp.batch_size}/rank, "
        f"coefficients: {inp.coeffs.source}"
    )
    runs: dict[str, BaselineRun] = {}
    if not args.no_baseline:
        for label, informed in (
            ("given the statistics", True),
            ("as a trainer calls it by default", False),
        ):
            runs[label] = BaselineRun(
                inp.stats, topo, inp.batch_size, args.baseline_timeout, informed=informed
            )
        print(
            f"TorchRec's planner runs beside the solve ({' / '.join(runs)}), "
            f"up to {args.baseline_timeout:g} s"
        )

    def pending() -> list[plans.Plan | None]:
        out = []
        for label, run in runs.items():
            got = run.result()
            print(f"TorchRec's planner, {label}: {got.status} in {got.seconds:.1f} s", flush=True)
            out.append(got.plan)
        return out

    print("solving (CP-SAT):", flush=True)
    try:
        res = optimize(
            inp,
            time_limit_s=args.time_limit,
            seed=args.seed,
            workers=args.workers,
            mode=args.mode,
            progress=lambda line: print(line, flush=True),
            min_gain=args.min_gain,
            split_margin=args.split_margin,
            current=in_force,  # the plan the profile trained with: what a user runs today
            pending_baselines=pending if runs else None,
        )
    finally:
        for run in runs.values():
            run.cancel()
    baseline, default = [run.result().plan for run in runs.values()] if runs else [None, None]
    plans.save(res.plan, args.out)
    if args.baseline_out and baseline is not None:
        plans.save(baseline, args.baseline_out)
    report(args, inp.topo, res, default, baseline)
    print(f"optimize took {time.perf_counter() - t_start:.1f} s (wall)")
    sys.stdout.flush()
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse bad numbers and unwritable outputs before any work (UserError naming the flag)."""
    from sparselift.atomic import check_writable

    def bounded(flag: str, value: int | None, top: int) -> None:
        if value is not None and not 1 <= value <= top:
            raise UserError(f"{flag} must be between 1 and {top}, got {value}")

    def positive(flag: str, value: float, zero_ok: bool = False) -> None:
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            raise UserError(
                f"{flag} must be a finite number {'>=' if zero_ok else '>'} 0, got {value}"
            )

    bounded("--world-size", args.world_size, MAX_WORLD_SIZE)
    bounded("--local-world-size", args.local_world_size, MAX_WORLD_SIZE)
    bounded("--batch-size", args.batch_size, MAX_BATCH_SIZE)
    bounded("--workers", args.workers, MAX_WORKERS)
    positive("--time-limit", args.time_limit)
    positive("--baseline-timeout", args.baseline_timeout)
    positive("--min-gain", args.min_gain, zero_ok=True)
    if args.split_margin is not None:
        positive("--split-margin", args.split_margin, zero_ok=True)
    if not 0 <= args.seed <= MAX_SEED:  # CP-SAT's random_seed is a 32-bit int
        raise UserError(f"--seed must be in 0..{MAX_SEED:,}, got {args.seed:,}")
    if args.profile:  # what-if flags a profile would silently ignore
        if args.calibration is not None:
            raise UserError("--calibration is for --workload: a --profile prices with its own")
        if args.max_rows is not None:
            raise UserError("--max-rows is for --workload: a --profile's tables are as profiled")
    check_writable(args.out)
    if args.baseline_out:
        check_writable(args.baseline_out)
        if Path(args.baseline_out).resolve() == Path(args.out).resolve():
            raise UserError(f"--baseline-out {args.baseline_out} is also --out: give two files")
