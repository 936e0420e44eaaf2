"""`sparselift profile`: train a workload under the profiler hook and write a profile directory."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any, NamedTuple

from sparselift.cli.train import add_training_args, config_from_args

HOOK = "sparselift.profiler.hook:make_hook"
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
    from sparselift.profiler.outdir import prepare_out_dir
    from sparselift.workloads.harness import MAX_STEPS, launched_externally, run_training

    if not 0 <= args.after <= MAX_STEPS:
        raise UserError(f"--after must be in 0..{MAX_STEPS:,}, got {args.after:,}")
    if not 0 <= args.steady_steps <= MAX_STEPS:
        raise UserError(f"--steady-steps must be in 0..{MAX_STEPS:,}, got {args.steady_steps:,}")
    if args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
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
    # Only the host of rank 0 writes: the other ranks stream their traces to it.
    here = os.environ.get("RANK", "0") == "0" if launched_externally() else cfg.node_rank == 0
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
            write_from_parent(out, result, extra0)
        except OSError as e:
            errors.append(f"writing {out}: {e}")
    else:
        errors.append("rank 0 returned no statistics")
    print(summary(out, result, args.warmup, args.steps))
    if errors:
        print(
            f"sparselift profile: profile in {out} is incomplete: {errors[0]}"
            + (f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""),
            file=sys.stderr,
        )
        return 1
    return 0


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
        cmd += [flag] if value is True else [flag, str(value)]
    return cmd


def write_from_parent(out: Path, result: Any, extra0: dict[str, Any]) -> None:
    """Write the profile from rank 0's facts and rows, with the harness's own step times and peak
    memory for every rank (`result`, a TrainResult); the steady steps rank 0 gathered are
    re-read from those step times (the same steps, the same timing), so the two agree.

    Raises:
        OSError: a file cannot be written (UnwritablePathError included).
    """
    from sparselift.profiler.manifest import ProfileFacts
    from sparselift.profiler.session import write_profile

    facts = ProfileFacts(**extra0["facts"])
    facts.step_times_s = [r.step_times_s for r in result.ranks]
    first, n = facts.warmup + len(facts.profiled_steps), len(facts.steady_step_s)
    if all(len(t) >= first + n for t in facts.step_times_s):
        facts.steady_step_s = [
            max(t[i] for t in facts.step_times_s) for i in range(first, first + n)
        ]
    facts.peak_memory_bytes = [r.peak_memory_bytes for r in result.ranks]
    facts.errors = [f"rank {r.rank}: {e}" for r in result.ranks for e in r.extra.get("errors", [])]
    write_profile(out, extra0["rows"], facts)


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
