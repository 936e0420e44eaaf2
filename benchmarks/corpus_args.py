"""The command line the what-if corpus benchmarks share (bench_whatif_corpus.py,
bench_optimizer_storage.py): which workloads of `synthetic.whatif_corpus`, at which sizes, and a
--quick run of a few small ones."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any


def corpus_parser(
    description: str, quick_help: str, time_limit_help: str | None = None
) -> argparse.ArgumentParser:
    """A parser with the corpus options: --workloads, --ranks, --min-tables, --max-tables,
    --time-limit (SparseLift's solver limit, s), --quick and --json (where to write the rows).

    Args:
        description: the benchmark's one-line description.
        quick_help: what --quick runs, in words.
        time_limit_help: --time-limit's help text, if any.
    Returns:
        The parser; the benchmark adds its own options and parses with `parse_corpus_args`.
    """
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--workloads", type=int, default=50)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 128])
    ap.add_argument("--min-tables", type=int, default=20)
    ap.add_argument("--max-tables", type=int, default=300)
    ap.add_argument("--time-limit", type=float, default=10.0, help=time_limit_help)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--json", default=None)
    return ap


def parse_corpus_args(ap: argparse.ArgumentParser, quick: Mapping[str, Any]) -> argparse.Namespace:
    """The command line's options; with --quick, `quick` ({option's dest: value}) replaces those
    options, given or not.

    Args:
        ap: a parser from `corpus_parser`.
        quick: what --quick sets.
    Returns:
        The parsed options.
    """
    args = ap.parse_args()
    if args.quick:
        for dest, value in quick.items():
            setattr(args, dest, value)
    return args
