"""`sparselift profile`: train a workload under the profiler hook and write a profile directory."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, NamedTuple

from sparselift.cli.train import add_training_args, config_from_args

HOOK = "sparselift.profiler.hook:make_hook"  # tests swap it

# What `--force` removes from a profile directory before writing a new profile there.
OUR_FILES = (
    "rank*.trace.json.gz",
    "rank*.et.json",
    "manifest.json",
    "access_stats.parquet",
    "hot_ids.parquet",
    ".*.tmp*",
)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `profile` to the `sparselift` sub-commands."""
    p = sub.add_parser(
        "profile", help="profile a few steps of sharded training into a profile directory"
    )
    add_training_args(p)
    p.set_defaults(steps=8)  # the calibration fits on the quieter half of the profiled steps
    p.add_argument(
        "--plan", default=None, help="a SparseLift plan file (default: TorchRec's planner)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="profile directory to write")
    p.add_argument(
        "--also",
        nargs=2,
        action="append",
        default=[],
        metavar=("PLAN", "DIR"),
        help="also profile PLAN into DIR, side by side in the same job (each plan's window in "
        "its own warm-up): profiles that share a job's speed compare as plans, not as jobs "
        "(repeatable). Each profile's steady steps are then its plan's timed turns in "
        "--rounds rounds after every window, --steady-steps in all (--after is not used)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        metavar="R",
        help="with --also: rounds of turns that time the steady steps (default 5)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty DIR (replacing a profile there)",
    )
    p.add_argument(
        "--after",
        type=int,
        default=5,
        metavar="N",
        help="steps to keep training after the window, to time the steady state (default 5; "
        "the run trains at least --steady-steps after it)",
    )
    p.add_argument(
        "--steady-steps",
        type=int,
        default=10,
        metavar="N",
        help="steps after the window timed with nothing attached, into the manifest's "
        "steady_step_s: the step the calibration closes on (default 10; 0: none)",
    )
    p.add_argument(
        "--execution-trace",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also record rank<R>.et.json (torch ExecutionTraceObserver; costs time and space; "
        "default off)",
    )
    p.set_defaults(run=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    """Profile the window, write the profile directory and print a summary.

    Returns:
        0, or 1 if the profile is incomplete (a rank's profiler failed; training went on).
    Raises:
        UserError: bad input, refused before the directory is touched or any rank starts.
        RankFailed: a rank failed.
    """
    from sparselift.errors import UserError
    from sparselift.profiler.from_ranks import write_from_parent
    from sparselift.profiler.outdir import prepare_out_dir
    from sparselift.workloads.harness import MAX_STEPS, run_training
    from sparselift.workloads.in_place import launched_externally, reports_here

    if not 0 <= args.after <= MAX_STEPS:
        raise UserError(f"--after must be in 0..{MAX_STEPS:,}, got {args.after:,}")
    if not 0 <= args.steady_steps <= MAX_STEPS:
        raise UserError(f"--steady-steps must be in 0..{MAX_STEPS:,}, got {args.steady_steps:,}")
    if args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    if args.also:
        return _run_side_by_side(args)
    cfg = config_from_args(
        args,
        plan=args.plan,
        hook=HOOK,
        progress=True,
        hook_args=dict(
            out_dir=str(Path(args.out).resolve()),
            warmup=args.warmup,
            steps=args.steps,
            execution_trace=args.execution_trace,
            command=command_line(args),
            steady_steps=args.steady_steps,
        ),
    )
    cfg.steps = args.steps + max(args.after, args.steady_steps)
    cfg.validate()  # bad input is refused before the directory is created or emptied
    here = reports_here(cfg.node_rank)  # the other ranks stream their traces to rank 0's host
    out = Path(args.out).resolve()
    if here:
        out = prepare_out_dir(args.out, args.force)
        if args.force:
            _remove_ours(out)
    try:
        result = run_training(cfg)
    except BaseException:
        if here:  # a failed run leaves no partial profile (the directory was empty or forced)
            _remove_ours(out)
        raise
    if not here:
        if not launched_externally():
            print(f"node {cfg.node_rank}: done; the profile is on node 0, in its --out")
        return 0
    errors = [
        e for r in result.ranks for e in (f"rank {r.rank}: {x}" for x in r.extra.get("errors", []))
    ]
    extra0 = result.ranks[0].extra
    if "facts" in extra0:
        try:
            write_from_parent(
                out,
                [r.extra for r in result.ranks],
                [r.step_times_s for r in result.ranks],
                [r.peak_memory_bytes for r in result.ranks],
            )
        except OSError as e:
            errors.append(f"writing {out}: {e}")
    else:
        errors.append("rank 0 returned no statistics")
    print(summary(out, result, args.warmup, args.steps))
    return _incomplete(f"profile in {out} is incomplete", errors)


def _run_side_by_side(args: argparse.Namespace) -> int:
    """`--also`: profile `--plan` into `--out` and each `--also` PLAN into its DIR, side by side
    in one job (`profiler.from_ranks.profile_side_by_side`)."""
    from sparselift.errors import UserError
    from sparselift.profiler.from_ranks import profile_side_by_side
    from sparselift.profiler.outdir import prepare_out_dir
    from sparselift.workloads.in_place import reports_here

    plans = [args.plan, *(plan for plan, _ in args.also)]
    outs = [Path(d).resolve() for d in [args.out, *(d for _, d in args.also)]]
    for i, d in enumerate(outs):
        if d in outs[:i]:
            raise UserError(f"--also {d}: two plans would be profiled into the same directory")
    cfg = config_from_args(args, contenders=plans, rounds=args.rounds, progress=True)
    # every window in its plan's warm-up; then the rounds time the steady steps
    cfg.warmup = args.warmup + args.steps
    cfg.steps = max(1, -(-args.steady_steps // max(args.rounds, 1)))  # validate() refuses 0
    cfg.validate()  # bad input is refused before any directory is created or emptied
    here = reports_here(cfg.node_rank)
    if here:
        outs = [prepare_out_dir(d, args.force) for d in outs]
        if args.force:
            for d in outs:
                _remove_ours(d)
    try:
        measured, errors = profile_side_by_side(
            cfg,
            list(outs),
            warmup=args.warmup,
            steps=args.steps,
            execution_trace=args.execution_trace,
            command=command_line(args),
            write=here,
            hook=HOOK,
        )
    except BaseException:
        if here:
            for d in outs:
                _remove_ours(d)
        raise
    if not here:
        return 0
    for c, (plan, out) in enumerate(zip(plans, outs, strict=True)):
        inside = window_step_times(measured.rank_steps_s[c], args.warmup, args.steps).inside_s
        turns = statistics.median(s for turn in measured.step_times_s[c] for s in turn)
        print(
            f"profiled steps {args.warmup}..{args.warmup + args.steps - 1} of "
            f"{plan or 'TorchRec plan'} into {out} (side by side with {len(plans) - 1} more): "
            f"step time profiled {inside * 1e3:.1f} ms, in its turns {turns * 1e3:.1f} ms"
        )
    return _incomplete("side-by-side profiles are incomplete", errors)


def _incomplete(what: str, errors: list[str]) -> int:
    """1 and one line on stderr when `errors` (the profile is incomplete), else 0."""
    if not errors:
        return 0
    print(
        f"sparselift profile: {what}: {errors[0]}"
        + (f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""),
        file=sys.stderr,
    )
    return 1


def _remove_ours(out: Path) -> None:
    """Remove what a profile run writes (OUR_FILES) from `out`."""
    for pattern in OUR_FILES:
        for f in out.glob(pattern):
            if f.is_file():
                f.unlink()


def command_line(args: argparse.Namespace) -> list[str]:
    """The command as parsed (every flag spelled out), so it reruns the same profile."""
    cmd = ["sparselift", "profile"]
    for key, value in vars(args).items():
        if key in ("command", "run", "force", "node_rank") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, list):  # --also PLAN DIR, repeated
            cmd += [x for pair in value for x in (flag, *map(str, pair))]
        else:
            cmd += [flag] if value is True else [flag, str(value)]
    return cmd


class WindowStepTimes(NamedTuple):
    """Median slowest-rank step time inside the profiled window and after it, in seconds."""

    inside_s: float
    after_s: float  # NaN when no step ran after the window


def window_step_times(step_times: list[list[float]], warmup: int, steps: int) -> WindowStepTimes:
    """The step times inside and after the window, from every rank's step times (`[rank][step]`).

    Why both: the difference is what profiling cost the profiled steps.
    """
    per_step = [max(t[i] for t in step_times) for i in range(len(step_times[0]))]
    inside = per_step[warmup : warmup + steps]
    after = per_step[warmup + steps :]
    return WindowStepTimes(
        statistics.median(inside), statistics.median(after) if after else float("nan")
    )


def summary(out: Path, result: Any, warmup: int, steps: int) -> str:
    """Two lines for people: what was profiled where, and the step time inside and after (and
    how much slower profiling made the window's steps)."""
    times = window_step_times([r.step_times_s for r in result.ranks], warmup, steps)
    ratio = times.inside_s / times.after_s if times.after_s > 0 else float("nan")
    return (
        f"profiled steps {warmup}..{warmup + steps - 1} of {result.workload} on "
        f"{result.world_size} ranks ({result.device}/{result.backend}) into {out}\n"
        f"  step time: profiled {times.inside_s * 1e3:.1f} ms, "
        f"after the window {times.after_s * 1e3:.1f} ms"
        + (f" (profiled/after {ratio:.2f}x)" if ratio == ratio else "")
    )
