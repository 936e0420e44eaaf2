"""`sparselift`: the one command-line entry point; one module here per command family.

The CLI modules parse arguments and print; the work is done by each stage's front door
(`workloads.harness`, `profiler`, `analysis.pipeline`, `optimizer.optimize`, `plans`).

Bad input — a flag argparse refuses, or any error with `is_user_error` (UserError, PlanError) — is
one line on stderr and exit code 2; a failed rank is its error and exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

# Each module has `register(subparsers)`, which adds its sub-commands with `set_defaults(run=...)`.
COMMAND_MODULES = (
    "sparselift.cli.train",
    "sparselift.cli.profile",
    "sparselift.cli.analyze",
    "sparselift.cli.compare",
    "sparselift.cli.optimize",
    "sparselift.cli.plan",
    "sparselift.cli.bench",
    "sparselift.cli.tune",
)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line, like every other bad input.

    argparse prints the usage and then the error; the usage is long and the error names the flag
    already, so only the error is printed, with a pointer to --help.
    """

    def error(self, message: str) -> NoReturn:
        """Print "<prog>: error: <message> (see <prog> --help)" and exit with code 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The `sparselift` parser with every command of COMMAND_MODULES registered."""
    parser = OneLineParser(
        prog="sparselift",
        description="Profile, analyze and optimize the sparse path of TorchRec training.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command.

    Args:
        argv: the arguments after `sparselift` (default: sys.argv[1:]).
    Returns:
        The exit code: 0 done (also when stdout's reader closed the pipe early), 2 bad input,
        1 a failed rank (or another command failure the command reports itself), 130
        interrupted.
    Raises:
        SystemExit: from argparse (code 2 for a refused flag, 0 for --help).
        Exception: anything that is neither bad input nor a failed rank: a bug, with its
            traceback.
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except BrokenPipeError:  # `sparselift … | head`: the reader left; what was asked is done
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 0
    except Exception as e:  # sorted into bad input, failed rank, or bug below
        if getattr(e, "is_user_error", False):
            message = " ".join(str(e).split("\n"))  # one line, whatever the message holds
            print(f"sparselift {args.command}: error: {message}", file=sys.stderr)
            return 2
        from sparselift.workloads.launch import RankFailed

        if isinstance(e, RankFailed):
            print(f"sparselift {args.command}: {e}", file=sys.stderr)
            return 1
        raise
    except KeyboardInterrupt:
        return 130
