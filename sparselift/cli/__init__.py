"""`sparselift`: the one command-line entry point; one module here per command family.

The CLI modules parse arguments and print; the work is done by each stage's front door
(`workloads.harness`, `profiler`, `analysis.pipeline`, `optimizer.optimize`, `plans`).

Bad input is one line on stderr and exit code 2; a failed rank is its error and exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module has `register(subparsers)`, which adds its sub-commands with `set_defaults(run=...)`.
COMMAND_MODULES = (
    "sparselift.cli.train",
    "sparselift.cli.profile",
    "sparselift.cli.analyze",
    "sparselift.cli.optimize",
    "sparselift.cli.plan",
    "sparselift.cli.bench",
)


def build_parser() -> argparse.ArgumentParser:
    """The `sparselift` parser with every command registered."""
    parser = argparse.ArgumentParser(
        prog="sparselift",
        description="Profile, analyze and optimize the sparse path of TorchRec training.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code (2 bad input, 1 a failed rank, 130 interrupted)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except Exception as e:  # noqa: BLE001 - sorted into bad input, failed rank, or bug below
        if getattr(e, "is_user_error", False):
            print(f"sparselift {args.command}: error: {e}", file=sys.stderr)
            return 2
        from sparselift.workloads.launch import RankFailed

        if isinstance(e, RankFailed):
            print(f"sparselift {args.command}: {e}", file=sys.stderr)
            return 1
        raise
    except KeyboardInterrupt:
        return 130
