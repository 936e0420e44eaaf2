"""`sparselift profile`: train a workload under the profiler hook and write a profile directory."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from sparselift.cli.train import add_training_args, config_from_args

HOOK = "sparselift.profiler.hook:make_hook"
OUR_FILES = (
    "rank*.trace.json.gz",
    "rank*.et.json",
    "manifest.json",
    "access_stats.parquet",
    ".*.tmp*",
)


def register(sub) -> None:
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
        help="steps to keep training after the window, to time the steady state (default 5)",
    )
    p.add_argument(
        "--execution-trace",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also record rank<R>.et.json (torch ExecutionTraceObserver; costs time and space; default off)",
    )
    p.set_defaults(run=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    from sparselift.errors import UserError
    from sparselift.profiler.outdir import prepare_out_dir
    from sparselift.workloads.harness import run_training

    if args.after < 0:
        raise UserError(f"--after must be >= 0, got {args.after}")
    if args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    out = prepare_out_dir(args.out, args.force)
    if args.force:
        for pattern in OUR_FILES:
            for f in out.glob(pattern):
                if f.is_file():
                    f.unlink()
    cfg = config_from_args(
        args,
        plan=args.plan,
        hook=HOOK,
        progress=True,
        hook_args=dict(
            out_dir=str(out.resolve()),
            warmup=args.warmup,
            steps=args.steps,
            execution_trace=args.execution_trace,
            command=command_line(args),
        ),
    )
    cfg.steps = args.steps + args.after
    result = run_training(cfg)
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


def command_line(args: argparse.Namespace) -> list[str]:
    """The command as parsed (every flag spelled out), so it reruns the same profile."""
    cmd = ["sparselift", "profile"]
    for key, value in vars(args).items():
        if key in ("command", "run", "force") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        cmd += [flag] if value is True else [flag, str(value)]
    return cmd


def write_from_parent(out: Path, result: Any, extra0: dict[str, Any]) -> None:
    """Rank 0's facts, with the harness's own per-step times and peak memory for every rank."""
    from sparselift.profiler.manifest import ProfileFacts
    from sparselift.profiler.session import write_profile

    facts = ProfileFacts(**extra0["facts"])
    facts.step_times_s = [r.step_times_s for r in result.ranks]
    facts.peak_memory_bytes = [r.peak_memory_bytes for r in result.ranks]
    facts.errors = [f"rank {r.rank}: {e}" for r in result.ranks for e in r.extra.get("errors", [])]
    write_profile(out, extra0["rows"], facts)


def window_ratio(step_times: list[list[float]], warmup: int, steps: int) -> tuple[float, float]:
    """(median slowest-rank step time inside the window, after it), in seconds."""
    per_step = [max(t[i] for t in step_times) for i in range(len(step_times[0]))]
    inside = per_step[warmup : warmup + steps]
    after = per_step[warmup + steps :]
    return statistics.median(inside), (statistics.median(after) if after else float("nan"))


def summary(out: Path, result: Any, warmup: int, steps: int) -> str:
    inside, after = window_ratio([r.step_times_s for r in result.ranks], warmup, steps)
    return (
        f"profiled steps {warmup}..{warmup + steps - 1} of {result.workload} on {result.world_size} ranks "
        f"({result.device}/{result.backend}) into {out}\n"
        f"  step time: profiled {inside * 1e3:.1f} ms, after the window {after * 1e3:.1f} ms"
    )
