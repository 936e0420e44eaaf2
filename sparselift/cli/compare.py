"""`sparselift compare BASELINE_PROFILE CANDIDATE_PROFILE [--also BASELINE CANDIDATE ...]`, or
`sparselift compare SIDE_BY_SIDE.json [--names BASELINE CANDIDATE]`: is the candidate measured
faster?"""

from __future__ import annotations

import argparse

from sparselift.analysis.compare import compare_jobs, compare_profiles, steady_steps
from sparselift.analysis.side_by_side import compare_side_by_side
from sparselift.atomic import check_writable, write_json
from sparselift.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    """Add `compare` to the `sparselift` sub-commands."""
    p = sub.add_parser(
        "compare",
        help="measured verdict on two profiles of the same job (baseline vs candidate plan)",
    )
    p.add_argument(
        "baseline",
        metavar="BASELINE_PROFILE",
        help="profile of the baseline plan, or alone: a side-by-side file of one job of your "
        "trainer (`sparselift.profiler.side_by_side`)",
    )
    p.add_argument(
        "candidate", metavar="CANDIDATE_PROFILE", nargs="?", help="profile of the candidate plan"
    )
    p.add_argument(
        "--names",
        nargs=2,
        default=None,
        metavar=("BASELINE", "CANDIDATE"),
        help="with a side-by-side file: the contenders to compare (default: the first two); "
        "a comma-separated list gives several models of a plan: the candidate must then beat "
        "every model of the baseline in each of its own",
    )
    p.add_argument(
        "--also",
        nargs=2,
        action="append",
        default=[],
        metavar=("BASELINE", "CANDIDATE"),
        help="another pair of separate jobs' profiles, run back to back (repeat: with 3 pairs "
        "or more the verdict pairs the jobs, and their spread is in the interval)",
    )
    p.add_argument(
        "--confidence", type=float, default=0.95, help="of the ratio's interval (default 0.95)"
    )
    p.add_argument("--json", default=None, metavar="OUT", help="also write the verdict as JSON")
    p.set_defaults(run=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    """Print the profiles' steady step times (each pair's, with --also; the contenders' with a
    side-by-side file) and the verdict; 0 whatever the verdict.

    Raises:
        UserError: profiles of different jobs, too few steps, fewer than 3 pairs with --also,
            a bad side-by-side file or contender name, --names with profiles, or an unwritable
            --json.
    """
    if args.json:
        check_writable(args.json)
    if args.candidate is None:
        if args.also:
            raise UserError("--also pairs separate jobs' profiles: give two profiles with it")
        groups = [[n for n in arg.split(",") if n] for arg in args.names] if args.names else None
        v = compare_side_by_side(
            args.baseline, (groups[0], groups[1]) if groups else None, args.confidence
        )
        shown = [(v.baseline, v.candidate)]
    elif args.names:
        raise UserError("--names picks contenders of a side-by-side file: give the file alone")
    elif args.also:
        pairs = [(args.baseline, args.candidate), *map(tuple, args.also)]
        v = compare_jobs(pairs, confidence=args.confidence)
        shown = [(steady_steps(b), steady_steps(c)) for b, c in pairs]
    else:
        v = compare_profiles(args.baseline, args.candidate, confidence=args.confidence)
        shown = [(v.baseline, v.candidate)]
    for base, cand in shown:
        for label, s in (("baseline", base), ("candidate", cand)):
            print(
                f"{label:9s} {s.profile}: {s.median_s * 1e3:.2f} ms/step (median of "
                f"{len(s.steps_s)} steps {s.where}, slowest rank)"
            )
    if "in the window" in (v.baseline.where, v.candidate.where):
        print(
            "note: steps inside the profiled window run slower than steady steps; "
            "profile with --after N to compare steady steps"
        )
    print(v.summary())
    if args.json:
        write_json(args.json, v.to_json())
    return 0
