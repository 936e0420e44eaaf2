"""`sparselift bench`: measure plans against each other with the training harness."""

from __future__ import annotations

import argparse
import sys

from sparselift.atomic import check_writable, write_json
from sparselift.bench import TORCHREC, contenders_for, run_bench
from sparselift.cli.train import add_training_args, config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    """Add `bench` to the `sparselift` sub-commands."""
    p = sub.add_parser(
        "bench", help="measure plans against each other (side by side in one job, steps/s, ratios)"
    )
    add_training_args(p)
    p.add_argument(
        "--plan", action="append", default=[], metavar="PLAN", help="a plan file; repeat for more"
    )
    p.add_argument(
        "--vs", choices=(TORCHREC,), default=None, help="also measure TorchRec's own plan"
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="rounds, every plan once a round (default 3)"
    )
    p.add_argument(
        "--separate-runs",
        action="store_true",
        help="train each plan in its own job per round, interleaved, instead of all side by side "
        "in one job (which holds every plan's model in memory at once)",
    )
    p.add_argument("--json", default=None, metavar="OUT", help="also write the results as JSON")
    p.set_defaults(run=run_bench_command)


def run_bench_command(args: argparse.Namespace) -> int:
    """Measure the contenders, print the table (and write --json); 0 on success.

    Raises:
        UserError: bad input (an unwritable --json included), refused before anything trains.
        RankFailed: a rank failed.
    """
    if args.json:
        check_writable(args.json)
    contenders = contenders_for(args.plan, args.vs == TORCHREC)
    result = run_bench(
        config_from_args(args),
        contenders,
        args.rounds,
        echo=lambda s: print(s, file=sys.stderr, flush=True),
        separate_runs=args.separate_runs,
    )
    print(result.table())
    if args.json:
        write_json(args.json, result.to_json())
    return 0
