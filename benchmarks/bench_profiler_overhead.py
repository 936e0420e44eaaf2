"""What profiling costs: steady-state steps/s after the profiled window vs a run never profiled.

Runs, side by side and alternating (`--repeats` pairs), the same workload on the same ranks:
  baseline  — the harness with no hook: warm-up W + S steps, then N measured steps;
  profiled  — `sparselift profile`'s hook: W warm-up steps, S profiled steps, then the same N steps.
Step time per step is the slowest rank's; each run's figure is the median over its steps.
Prints steps/s after the window relative to the baseline (target ≥ 0.98) and how much slower the
profiled steps themselves were.

    .venv/bin/python benchmarks/bench_profiler_overhead.py --workload tiny --nproc 2 --after 50
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from typing import Any, NamedTuple

from sparselift.cli.profile import HOOK
from sparselift.workloads.harness import TrainConfig, run_training


class ProfiledRun(NamedTuple):
    """Median seconds per step of a profiled run: inside the profiled window, and after it."""

    window_s: float
    after_s: float


def slowest_rank(result: Any) -> list[float]:
    """Per step, the slowest rank's step time (a `TrainResult`'s ranks' step_times_s)."""
    times = [r.step_times_s for r in result.ranks]
    return [max(t[i] for t in times) for i in range(len(times[0]))]


def baseline(args: argparse.Namespace) -> float:
    """Median seconds per step of a run never profiled, over the steps `profiled` measures after."""
    cfg = TrainConfig(
        workload=args.workload,
        nproc=args.nproc,
        warmup=args.warmup + args.steps,
        steps=args.after,
        max_rows=args.max_rows,
        pipeline=args.pipeline,
        device=args.device,
    )
    return statistics.median(slowest_rank(run_training(cfg))[cfg.warmup :])


def profiled(args: argparse.Namespace) -> ProfiledRun:
    """One run with `sparselift profile`'s hook: its profiled window and the steps after it."""
    with tempfile.TemporaryDirectory(prefix="sparselift-bench-") as out:
        cfg = TrainConfig(
            workload=args.workload,
            nproc=args.nproc,
            warmup=args.warmup,
            steps=args.steps + args.after,
            max_rows=args.max_rows,
            pipeline=args.pipeline,
            device=args.device,
            hook=HOOK,
            hook_args=dict(
                out_dir=out,
                warmup=args.warmup,
                steps=args.steps,
                execution_trace=args.execution_trace,
            ),
        )
        per_step = slowest_rank(run_training(cfg))
    window = per_step[args.warmup : args.warmup + args.steps]
    return ProfiledRun(
        statistics.median(window), statistics.median(per_step[args.warmup + args.steps :])
    )


def main() -> None:
    """Run the pairs and print steps/s never profiled, after the window, and inside it."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="tiny")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument(
        "--after", type=int, default=50, help="steady-state steps measured after the window"
    )
    p.add_argument("--repeats", type=int, default=3, help="baseline/profiled pairs, alternating")
    p.add_argument("--max-rows", type=int, default=None)
    p.add_argument("--pipeline", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--execution-trace", action="store_true", help="also record the execution trace")
    args = p.parse_args()

    base, window, after = [], [], []
    for i in range(args.repeats):
        base.append(baseline(args))
        w, a = profiled(args)
        window.append(w)
        after.append(a)
        print(
            f"pair {i}: baseline {base[-1] * 1e3:.2f} ms/step   profiled window {w * 1e3:.2f}   "
            f"after window {a * 1e3:.2f}"
        )
    b, w, a = statistics.median(base), statistics.median(window), statistics.median(after)
    print(
        f"\n{args.workload}, {args.nproc} ranks, {args.steps} profiled steps after {args.warmup}, "
        f"{args.after} steps after the window, median of {args.repeats} pairs"
    )
    print(f"  never profiled        {1 / b:8.2f} steps/s   ({b * 1e3:.2f} ms/step)")
    print(f"  after the window      {1 / a:8.2f} steps/s   ratio {b / a:.3f}  (target >= 0.98)")
    print(f"  profiled steps        {1 / w:8.2f} steps/s   slowdown {w / b:.2f}x")


if __name__ == "__main__":
    main()
