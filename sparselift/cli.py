"""`sparselift`: the one command-line entry point. Each stage adds its own sub-commands.

Bad input is one line on stderr and exit code 2; a failed rank is its error and exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module has `register(subparsers)`, which adds its sub-commands with `set_defaults(run=...)`.
COMMAND_MODULES = (
    "sparselift.workloads.commands",
    "sparselift.profiler.commands",
    "sparselift.analysis.commands",
    "sparselift.optimizer.commands",
    "sparselift.plans.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparselift", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # a stage not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
