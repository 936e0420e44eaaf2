"""`sparselift tune`: plan → profile → re-plan until a fixed point, then ship only what measured
faster in an A/B against the baseline (both side by side in one job, two models of each)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from sparselift.atomic import check_writable
from sparselift.cli.train import add_training_args, config_from_args
from sparselift.tune import TRY_GAIN, StepFailed, tune


def register(sub: argparse._SubParsersAction) -> None:
    """Add `tune` to the `sparselift` sub-commands."""
    p = sub.add_parser(
        "tune",
        help="profile, plan and re-plan on the built-in harness; keep the plan only if measured "
        "faster than the baseline",
    )
    add_training_args(p)
    p.add_argument("--out", required=True, help="the plan file to write (candidate or baseline)")
    p.add_argument(
        "--rounds", type=int, default=8, help="A/B rounds: turns of --steps steps (default 8)"
    )
    p.add_argument(
        "--more-rounds",
        type=int,
        default=None,
        help="A/B rounds of a second job where the first leaves the verdict open (median "
        "faster, interval not past 1); default: 2 × --rounds; 0: one job only",
    )
    p.add_argument(
        "--max-iterations", type=int, default=3, help="candidate profiles at most (default 3)"
    )
    p.add_argument("--profile-steps", type=int, default=8, help="profiled steps (default 8)")
    p.add_argument(
        "--after", type=int, default=5, help="steady steps timed after each window (default 5)"
    )
    p.add_argument("--time-limit", type=float, default=30.0, help="optimize's solver seconds")
    p.add_argument(
        "--baseline", default=None, metavar="PLAN", help="plan to beat (default: TorchRec's)"
    )
    p.add_argument(
        "--min-gain",
        type=float,
        default=TRY_GAIN,
        help="the predicted gain a new plan needs to be tried (optimize's --min-gain), and a "
        "plan with splits over the best plan without (--split-margin); default "
        f"{TRY_GAIN}: each plan tried is measured, and only an A/B win ships",
    )
    p.add_argument(
        "--work", default=None, metavar="DIR", help="keep plans and profiles here (default: temp)"
    )
    p.add_argument(
        "--html",
        default=None,
        metavar="REPORT",
        help="also write an HTML report: verdict, each iteration's predicted and measured step, "
        "the A/B rounds and the plans",
    )
    p.set_defaults(run=run_tune)


def run_tune(args: argparse.Namespace) -> int:
    """Run the loop and the A/B; 0 when a plan was written, else the failed step's exit code.

    Raises:
        UserError: bad input, refused before anything trains.
    """
    from sparselift.cli import main

    check_writable(args.out)
    if args.html:
        check_writable(args.html)
    cfg = config_from_args(args)
    with tempfile.TemporaryDirectory(prefix="sparselift-tune-") as tmp:
        work = Path(args.work or tmp)
        try:
            result = tune(
                cfg,
                args.out,
                work,
                main,
                rounds=args.rounds,
                more_rounds=args.more_rounds,
                max_iterations=args.max_iterations,
                profile_steps=args.profile_steps,
                after=args.after,
                time_limit_s=args.time_limit,
                baseline=args.baseline,
                min_gain=args.min_gain,
                echo=lambda line: print(line, flush=True),
            )
        except StepFailed as e:
            print(f"sparselift tune: stopped: {e}; {args.out} not written", file=sys.stderr)
            return e.code
        if args.html:
            from sparselift.tune_report import write_tune_report

            write_tune_report(args.html, result, work)
            print(f"wrote {args.html}")
    return 0
